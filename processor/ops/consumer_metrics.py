"""A consumer app's Prometheus registry: its counters, read per scrape, and engine time per batch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from processor.apps.consumer import ConsumerApp
from processor.ops.metrics import with_process_metrics

#: One batch's engine time: a forward pass, milliseconds to a minute.
ENGINE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ConsumerMetrics:
    """A consumer app's registry: its ``ConsumerStats`` read per scrape, plus engine time per batch.

    Build it before the app (its :meth:`engine_ran` is the app's ``on_engine`` hook), then
    :meth:`watch` the app.
    """

    def __init__(self, consumer: str, registry: CollectorRegistry | None = None) -> None:
        self.consumer = consumer
        self.registry = registry or with_process_metrics(CollectorRegistry(auto_describe=False))
        self._engine = Histogram(
            "tokenfabric_consumer_app_engine_seconds",
            "Engine time of one batch (batches the contract check rejected never reach the engine).",
            labelnames=["consumer"],
            buckets=ENGINE_BUCKETS,
            registry=self.registry,
        ).labels(consumer)

    def engine_ran(self, seconds: float) -> None:
        self._engine.observe(seconds)

    def watch(self, app: ConsumerApp) -> None:
        self.registry.register(ConsumerAppCollector(app))


class ConsumerAppCollector(Collector):
    """``app.stats`` as counters (the app replaces ``stats`` when ``run`` starts: read it each time)."""

    def __init__(self, app: ConsumerApp) -> None:
        self.app = app

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        stats = self.app.stats
        consumer, model = self.app.contract.consumer, self.app.contract.model
        labels = ["consumer", "model"]
        key = [consumer, model]
        items = CounterMetricFamily(
            "tokenfabric_consumer_app_items",
            "Items answered, by completion status.",
            labels=[*labels, "status"],
        )
        for status in ("ok", "failed", "rejected"):
            items.add_metric([*key, status], getattr(stats, status))
        yield items
        for name, doc, value in (
            ("batches", "Batches read, dead-lettered ones included.", stats.batches),
            ("dead_lettered", "Undecodable batches sent to the dead-letter topic.", stats.dead_lettered),
            ("input_tokens", "Prompt tokens of batches the engine ran.", stats.input_tokens),
            ("output_tokens", "Tokens generated (items answered ok).", stats.output_tokens),
            (
                "padded_tokens",
                "Padded tokens of batches the engine ran: items x padded length.",
                stats.padded_tokens,
            ),
            ("cache_hits", "Batches the engine served from its prefix cache.", stats.cache_hits),
            ("cache_lookups", "Batches the engine ran, each one prefix-cache lookup.", stats.cache_lookups),
        ):
            fam = CounterMetricFamily(f"tokenfabric_consumer_app_{name}", doc, labels=labels)
            fam.add_metric(key, value)
            yield fam
