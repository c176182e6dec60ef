"""Metrics (processor/ops/metrics.py, processor/ops/histograms.py, processor/ops/consumer_metrics.py):
what /metrics says, checked against what was done.

The tests drive the real scheduling core behind a stand-in service (no Kafka) and read the exposition
text back through prometheus_client's own parser. The scraped counters of a real ProcessorService and
ConsumerApp against a broker: tests/broker/test_metrics.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from processor import __version__
from processor.apps.consumer import ConsumerApp, ConsumerHooks
from processor.core.contract import Contract
from processor.core.item import Item, ItemOutcome
from processor.ops.consumer_metrics import ConsumerMetrics
from processor.ops.histograms import FastHistograms
from processor.ops.kafka_stats import KafkaStats
from processor.ops.metrics import processor_registry
from processor.sim.cardmodel import CardSpec
from tests.common import ROOT
from tests.ops.helpers import FakeService, read_registry, value

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
    core.cache_reported("card", True)
    svc.counters.consumed = 6
    svc.lag = {0: 3, 1: 0}
    registry = processor_registry(svc, pipeline_in_background=False)
    svc.observer.committed(0.004)
    svc.observer.checkpointed(0.0002)
    svc.observer.dispatched(batch, 2000)
    svc.observer.answered(batch, len(batch.items), 2500)

    m = read_registry(registry)
    for model, ls in lengths.items():
        assert value(m, "tokenfabric_received_tokens_total", model=model) == sum(ls)
        assert value(m, "tokenfabric_received_items_total", model=model) == len(ls)
    done = batch.items
    assert value(m, "tokenfabric_completed_tokens_total", model="m1") == sum(it.length for it in done[:-1])
    assert value(m, "tokenfabric_failed_tokens_total", model="m1") == done[-1].length
    assert value(m, "tokenfabric_routed_tokens", model="m1") == sum(it.length for it in done)
    waiting = sum(sum(ls) for ls in lengths.values()) - sum(it.length for it in done)
    assert value(m, "tokenfabric_queued_tokens", model="m1") + value(
        m, "tokenfabric_queued_tokens", model="m2"
    ) == (waiting)
    assert value(m, "tokenfabric_consumer_real_tokens_total", consumer="card") == batch.real_tokens
    assert value(m, "tokenfabric_consumer_padded_tokens_total", consumer="card") == batch.padded_tokens
    assert value(m, "tokenfabric_consumer_routed_batches_total", consumer="card") == 1
    assert value(m, "tokenfabric_consumer_routed_items_total", consumer="card") == len(done)
    assert value(m, "tokenfabric_consumer_cache_hits_total", consumer="card") == 1
    assert value(m, "tokenfabric_consumer_cache_lookups_total", consumer="card") == 1
    assert value(m, "tokenfabric_consumer_free_slots", consumer="card", model="m1") == 1
    assert value(m, "tokenfabric_consumer_in_flight_batches", consumer="card", model="m1") == 0
    for model in lengths:
        for equation in ("received", "routed"):
            assert value(m, "tokenfabric_ledger_imbalance_tokens", model=model, equation=equation) == 0
    assert value(m, "tokenfabric_ledger_ok") == 1
    # m2 has no consumer: its first item (arrived at 1000 ms) has waited 5 s at 6000 ms.
    assert value(m, "tokenfabric_oldest_waiting_age_seconds", model="m2") == pytest.approx(5.0)
    assert value(m, "tokenfabric_lanes_in_use") == core.view.lanes().lanes_in_use
    assert value(m, "tokenfabric_lanes_budget") == core.view.lanes().lane_budget
    assert value(m, "tokenfabric_lanes_opened_total") == core.view.lanes().new_lanes
    assert value(m, "tokenfabric_ingest_messages_total") == 6
    assert value(m, "tokenfabric_ingest_lag_messages", partition="0") == 3
    assert value(m, "tokenfabric_commit_seconds_count") == 1
    assert value(m, "tokenfabric_checkpoint_seconds_count") == 1
    assert value(m, "process_cpu_seconds_total") >= 0
    assert value(m, "tokenfabric_build_info", version=__version__) == 1
    # The ready-made ratios: one batch sent, one cache lookup, one hit.
    waste = 1 - batch.real_tokens / batch.padded_tokens
    assert value(m, "tokenfabric_consumer_padding_waste_ratio", consumer="card") == pytest.approx(waste)
    assert value(m, "tokenfabric_padding_waste_ratio") == pytest.approx(waste)
    assert value(m, "tokenfabric_consumer_cache_hit_ratio", consumer="card") == 1
    assert value(m, "tokenfabric_cache_hit_ratio") == 1
    # m2 has no consumer: all its items wait for nobody; m1's do not.
    assert value(m, "tokenfabric_unserved_waiting_items", model="m2") == len(lengths["m2"])
    assert ("tokenfabric_unserved_waiting_items", frozenset({("model", "m1")})) not in m
    # Each item of the batch waited from its arrival (1000 + n ms) to dispatch at 2000 ms: 0.997 to 1 s.
    n = len(batch.items)
    assert value(m, "tokenfabric_item_queued_seconds_count", model="m1") == n
    assert value(m, "tokenfabric_item_queued_seconds_bucket", model="m1", le="1.0") == n
    assert value(m, "tokenfabric_item_queued_seconds_bucket", model="m1", le="0.5") == 0
    arrivals = sum(it.arrival_ms for it in batch.items)
    queued_s = (2000 * n - arrivals) / 1000
    assert value(m, "tokenfabric_item_queued_seconds_sum", model="m1") == pytest.approx(queued_s)
    # Dispatched at 2000 ms (batch.created_ms), answered at 2500 ms.
    assert batch.created_ms == 2000
    assert value(m, "tokenfabric_item_in_flight_seconds_count", model="m1") == n
    assert value(m, "tokenfabric_item_in_flight_seconds_sum", model="m1") == pytest.approx(0.5 * n)
    assert value(m, "tokenfabric_item_in_flight_seconds_bucket", model="m1", le="0.25") == 0
    assert value(m, "tokenfabric_item_in_flight_seconds_bucket", model="m1", le="0.5") == n
    assert value(m, "tokenfabric_batch_size_items_count", consumer="card") == 1
    assert value(m, "tokenfabric_batch_size_items_sum", consumer="card") == n
    assert value(m, "tokenfabric_batch_padded_length_tokens_sum", consumer="card") == batch.padded_length
    assert value(m, "tokenfabric_batch_padded_length_tokens_bucket", consumer="card", le="+Inf") == 1


def test_a_ledger_that_does_not_balance_reads_non_zero() -> None:
    svc = FakeService()
    svc.core.submit(Item("a", "m", 1, 100, 0), 0)
    svc.core.view.model_book("m").queued.tokens -= 7  # a planted leak: counted received, held nowhere
    m = read_registry(processor_registry(svc, pipeline_in_background=False))
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
    m = read_registry(processor_registry(svc, pipeline_in_background=False))
    assert value(m, "tokenfabric_oldest_waiting_age_seconds", model="m") == pytest.approx(6.0)
    core.item_done(batch.batch_id, "old", True, 10_000)
    core.dispatch(10_000)  # "young" leaves too: nothing waits
    m = read_registry(processor_registry(svc, pipeline_in_background=False))
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
        hooks=ConsumerHooks(on_engine=metrics.engine_ran),
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


def test_the_lock_free_histogram_exposes_what_prometheus_clients_own_would() -> None:
    """FastHistograms (per-item, owner thread) against prometheus_client's Histogram, same values."""
    bounds = (0.01, 0.1, 1.0, 10.0)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = FastHistograms("h_seconds", "h", ["model"], bounds)
    ours.register(fast)
    ref = Histogram("h_seconds", "h", ["model"], buckets=bounds, registry=theirs)
    for v in (0.0, 0.01, 0.010001, 0.5, 1.0, 9.99, 10.0, 11.0, 500.0):
        fast.of("m").observe(v)
        ref.labels("m").observe(v)
    fast.of("m").observe(0.05, times=3)  # one batch's items answered together
    for _ in range(3):
        ref.labels("m").observe(0.05)
    fast.of("ms").observe_ms([0, 10, 11, -5, 500, 1000, 12_000])  # the same as seconds, negative as 0
    for v in (0.0, 0.01, 0.011, 0.0, 0.5, 1.0, 12.0):
        ref.labels("ms").observe(v)
    mine = {k: v for k, v in read_registry(ours).items() if not k[0].endswith("_created")}
    reference = {k: v for k, v in read_registry(theirs).items() if not k[0].endswith("_created")}
    assert mine == pytest.approx(reference)
    assert value(mine, "h_seconds_bucket", model="m", le="0.01") == 2  # le is inclusive
    with pytest.raises(ValueError, match="increase"):
        FastHistograms("x", "x", [], (1.0, 0.5)).of()


def test_consumer_app_end_to_end_counts_from_each_items_producer_timestamp() -> None:
    from processor.wire.records import BatchRecord, TokenItemRecord

    metrics = ConsumerMetrics("card")

    def item(n: int, produced_ms: int) -> TokenItemRecord:
        return TokenItemRecord(
            item_id=f"i{n}", model="m", shape=1, token_count=8, tokens=b"\0" * 32, produced_ms=produced_ms
        )

    items = [item(0, 9_000), item(1, 7_000), item(2, 0)]
    batch = BatchRecord(
        batch_id="b1", consumer="card", model="m", shape=1, lane=0, padded_length=16, pad_multiple=8,
        created_ms=10_000, items=items,
    )  # fmt: skip
    metrics.completed(batch, 10_000)
    m = read_registry(metrics.registry)
    # the item without a timestamp (0) is left out
    assert value(m, "tokenfabric_consumer_app_end_to_end_seconds_count", consumer="card") == 2
    assert value(m, "tokenfabric_consumer_app_end_to_end_seconds_sum", consumer="card") == pytest.approx(4.0)
    assert value(m, "tokenfabric_consumer_app_end_to_end_seconds_bucket", consumer="card", le="1.0") == 1
    assert set(metrics.hooks()) == {"on_engine", "on_completed"}
    assert metrics.kafka_conf({"a": "b"})["stats_cb"] == metrics.kafka.on_stats


def test_docs_metrics_lists_every_metric_and_no_other() -> None:
    """docs/metrics.md is the reference: every exposed name is in its tables, and nothing else is."""
    from processor.apps.ride import BrokerWatch
    from processor.ops.broker_metrics import BrokerCollector

    svc = FakeService()
    svc.core.set_contract(Contract("c", "m", budget_tokens=1024, max_items=4))
    svc.core.submit(Item("a", "m", 1, 10, 0), 0)
    svc.core.submit(Item("b", "m", 1, 10, 0), 0)
    (batch,) = svc.core.dispatch(0)
    svc.core.items_done(batch.batch_id, [ItemOutcome("a", True)], 0, [4])  # prompt counts exported
    svc.lag = {0: 0}
    exposed = {
        f.name
        for f in text_string_to_metric_families(
            generate_latest(
                processor_registry(
                    svc, extra=[KafkaStats(), BrokerCollector(BrokerWatch())], pipeline_in_background=False
                )
            ).decode()
        )
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


def test_jobs_tokens_and_shares_are_exposed_per_job() -> None:
    from processor.core.shares import JobPolicy
    from tests.ops.helpers import parse, value

    svc = FakeService()
    svc.core.set_contract(Contract("c", "m", budget_tokens=1024, max_items=4))
    svc.core.set_policy("big", JobPolicy(weight=3, max_tokens=15))
    svc.core.submit(Item("a", "m", 1, 10, 0, job="big"), 0)
    svc.core.submit(Item("b", "m", 1, 10, 0, job="big"), 0)
    svc.core.dispatch(0)
    samples = parse(generate_latest(processor_registry(svc, pipeline_in_background=False)).decode())
    assert value(samples, "tokenfabric_job_tokens", job="big", stage="routed") == 10
    assert value(samples, "tokenfabric_job_tokens", job="big", stage="queued") == 10
    assert value(samples, "tokenfabric_job_weight", job="big") == 3
    assert value(samples, "tokenfabric_job_quota_tokens", job="big") == 15
    assert value(samples, "tokenfabric_job_capped", job="big") == 1  # 5 tokens left: not even one item


def test_the_ingest_lag_of_a_partition_given_up_leaves_at_once() -> None:
    """The service keeps the last lag of every partition it ever held; only those it owns now are
    exported, and the owned count with them."""
    svc = FakeService(owned=frozenset({0, 1}))
    svc.lag = {0: 3, 1: 0, 2: 9}  # partition 2 was handed to another instance in a rebalance
    registry = processor_registry(svc, pipeline_in_background=False)
    m = read_registry(registry)
    lags = {dict(k[1])["partition"]: v for k, v in m.items() if k[0] == "tokenfabric_ingest_lag_messages"}
    assert lags == {"0": 3, "1": 0}
    assert value(m, "tokenfabric_ingest_owned_partitions") == 2
    svc.owned = frozenset()  # revoked (exactly-once lets go of everything until the next assignment)
    m = read_registry(registry)
    assert not [k for k in m if k[0] == "tokenfabric_ingest_lag_messages"]
    assert value(m, "tokenfabric_ingest_owned_partitions") == 0


def test_the_consumer_apps_lag_counts_batches_not_offsets() -> None:
    """Three batches on the topic after the app's position, whose last stable offset is five further
    on (as if two commit markers took offsets): the lag is 3 batches, not 5."""
    import json

    from processor.engines.sim import SimEngine
    from processor.kafka.memory import MemoryKafka
    from processor.kafka.topics import TopicNames, topic_specs

    kafka = MemoryKafka()
    topics = TopicNames("lagtest")
    kafka.create_topics(topic_specs(topics, consumers=["card"]))
    contract = Contract("card", "m", budget_tokens=4096, max_items=8)
    metrics = ConsumerMetrics("card")
    app = ConsumerApp({}, topics, contract, SimEngine(CardSpec(), 0.0), clients=kafka.clients())
    metrics.watch(app)
    producer = kafka.clients().producer({})
    for n in range(4):
        producer.produce(app.batch_topic, f"batch {n}".encode(), f"b{n}".encode())
    producer.flush()
    key = {"consumer": "card", "model": "m"}
    m = read_registry(metrics.registry)
    assert ("tokenfabric_consumer_app_lag_batches", frozenset(key.items())) not in m  # no statistics yet

    def stats(position: int, stable_end: int) -> str:
        part = {"fetch_state": "active", "app_offset": position, "ls_offset": stable_end, "consumer_lag": 0}
        doc = {
            "name": "rdkafka#consumer-1",
            "type": "consumer",
            "topics": {app.batch_topic: {"partitions": {"0": part}}},
        }
        return json.dumps(doc)

    metrics.kafka.on_stats(stats(1, 6))
    assert value(read_registry(metrics.registry), "tokenfabric_consumer_app_lag_batches", **key) == 3
    metrics.kafka.on_stats(stats(6, 6))  # read to the end: nothing to count
    assert value(read_registry(metrics.registry), "tokenfabric_consumer_app_lag_batches", **key) == 0
    app.engine.close()


def test_the_lag_counters_own_reader_is_not_counted_in_the_apps_lag() -> None:
    """The reader that counts unread batches reads the batch topic too: built from the app's
    settings, it reported its own statistics, and its position was added to the app's lag (23
    batches on a drained consumer where Kafka said 1). It is built without the statistics callback."""
    import json

    from processor.engines.sim import SimEngine
    from processor.kafka.memory import MemoryClients, MemoryKafka
    from processor.kafka.topics import TopicNames, topic_specs

    built: list[dict[str, Any]] = []

    class Recording(MemoryClients):
        def consumer(self, settings: Any) -> Any:
            built.append(dict(settings))
            return super().consumer(settings)

    kafka = MemoryKafka()
    topics = TopicNames("lagown")
    kafka.create_topics(topic_specs(topics, consumers=["card"]))
    metrics = ConsumerMetrics("card")
    conf = metrics.kafka_conf({})
    assert "stats_cb" in conf  # the app's own clients do report
    contract = Contract("card", "m", budget_tokens=4096, max_items=8)
    app = ConsumerApp(conf, topics, contract, SimEngine(CardSpec(), 0.0), clients=Recording(kafka))
    metrics.watch(app)
    producer = kafka.clients().producer({})
    for n in range(3):
        producer.produce(app.batch_topic, f"batch {n}".encode(), f"b{n}".encode())
    producer.flush()
    part = {"fetch_state": "active", "app_offset": 1, "ls_offset": 3, "consumer_lag": 0}
    doc = {
        "name": "rdkafka#consumer-1",
        "type": "consumer",
        "topics": {app.batch_topic: {"partitions": {"0": part}}},
    }
    metrics.kafka.on_stats(json.dumps(doc))
    key = {"consumer": "card", "model": "m"}
    assert value(read_registry(metrics.registry), "tokenfabric_consumer_app_lag_batches", **key) == 2
    (reader,) = [c for c in built if str(c.get("group.id", "")).startswith("tokenfabric-lag-")]
    assert "stats_cb" not in reader and "statistics.interval.ms" not in reader
    app.engine.close()


def test_cached_and_computed_prompt_tokens_are_exported_once_consumers_report_them() -> None:
    svc = FakeService()
    core = svc.core
    core.set_contract(Contract("card", "m", budget_tokens=4096, max_items=8, pad_multiple=8, max_inflight=1))
    for n in range(3):
        core.submit(Item(f"i{n}", "m", 0xA, 100, arrival_ms=0, job="j"), 0)
    (batch,) = core.dispatch(0)
    names = {
        f.name
        for f in text_string_to_metric_families(
            generate_latest(processor_registry(svc, pipeline_in_background=False)).decode()
        )
    }
    assert "tokenfabric_cached_prompt_tokens" not in names  # nothing reported: nothing claimed
    core.items_done(batch.batch_id, [ItemOutcome(f"i{n}", n < 2) for n in range(3)], 10, [90, 40, 100])
    m = read_registry(processor_registry(svc, pipeline_in_background=False))
    assert value(m, "tokenfabric_cached_prompt_tokens_total", model="m") == 130  # the failed item's 100: not
    assert value(m, "tokenfabric_prefill_tokens_total", model="m") == 70
    assert value(m, "tokenfabric_consumer_cached_prompt_tokens_total", consumer="card") == 130
    assert value(m, "tokenfabric_consumer_prefill_tokens_total", consumer="card") == 70
    assert value(m, "tokenfabric_job_tokens", job="j", stage="cached_prompt") == 130
    assert value(m, "tokenfabric_job_tokens", job="j", stage="prefill") == 70
