"""Metrics (processor/ops/metrics.py, processor/ops/consumer_metrics.py): what /metrics says, checked
against what was done.

The tests drive the real scheduling core behind a stand-in service (no Kafka) and read the exposition
text back through prometheus_client's own parser. The scraped counters of a real ProcessorService and
ConsumerApp against a broker: tests/broker/test_metrics.py."""

from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from processor.apps.consumer import ConsumerApp
from processor.core.contract import Contract
from processor.core.item import Item
from processor.ops.consumer_metrics import ConsumerMetrics
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


def test_jobs_tokens_and_shares_are_exposed_per_job() -> None:
    from processor.core.shares import JobPolicy
    from tests.ops.helpers import parse, value

    svc = FakeService()
    svc.core.set_contract(Contract("c", "m", budget_tokens=1024, max_items=4))
    svc.core.shares.set_policy("big", JobPolicy(weight=3, max_tokens=15))
    svc.core.submit(Item("a", "m", 1, 10, 0, job="big"), 0)
    svc.core.submit(Item("b", "m", 1, 10, 0, job="big"), 0)
    svc.core.dispatch(0)
    samples = parse(generate_latest(processor_registry(svc)).decode())
    assert value(samples, "tokenfabric_job_tokens", job="big", stage="routed") == 10
    assert value(samples, "tokenfabric_job_tokens", job="big", stage="queued") == 10
    assert value(samples, "tokenfabric_job_weight", job="big") == 3
    assert value(samples, "tokenfabric_job_quota_tokens", job="big") == 15
    assert value(samples, "tokenfabric_job_capped", job="big") == 1  # 5 tokens left: not even one item
