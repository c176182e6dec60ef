"""A consumer app's Prometheus registry: its counters, read per scrape, engine time per batch, end to
end latency per item, and its Kafka clients' statistics (its lag among them)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from processor.apps.consumer import ConsumerApp
from processor.core.measures import padding_waste
from processor.ops.histograms import FastHistograms
from processor.ops.kafka_stats import STATS_INTERVAL_MS, KafkaStats
from processor.ops.metrics import with_process_metrics
from processor.wire.records import BatchRecord

#: One batch's engine time: a forward pass, milliseconds to a minute.
ENGINE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


#: Producer's timestamp to completion: the whole pipeline, including any backlog.
END_TO_END_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)


class ConsumerMetrics:
    """A consumer app's registry: its ``ConsumerStats`` read per scrape, plus engine time per batch
    and end-to-end time per item.

    Build it before the app: pass :meth:`hooks` to the app and the app's Kafka config through
    :meth:`kafka_conf`, then :meth:`watch` the app.
    """

    def __init__(
        self,
        consumer: str,
        registry: CollectorRegistry | None = None,
        stats_interval_ms: int = STATS_INTERVAL_MS,
    ) -> None:
        self.consumer = consumer
        self.registry = registry or with_process_metrics(CollectorRegistry(auto_describe=False))
        self._engine = Histogram(
            "tokenfabric_consumer_app_engine_seconds",
            "Engine time of one batch (batches the contract check rejected never reach the engine).",
            labelnames=["consumer"],
            buckets=ENGINE_BUCKETS,
            registry=self.registry,
        ).labels(consumer)
        e2e = FastHistograms(
            "tokenfabric_consumer_app_end_to_end_seconds",
            "An item's time from its producer's timestamp (TokenItem.produced_ms) to its completion.",
            ["consumer"],
            END_TO_END_BUCKETS,
        )
        self.registry.register(e2e)
        self._e2e = e2e.of(consumer)
        self.kafka = KafkaStats(stats_interval_ms, {"consumer": consumer})
        self.registry.register(self.kafka)

    def engine_ran(self, seconds: float) -> None:
        self._engine.observe(seconds)

    def completed(self, batch: BatchRecord, completed_ms: int) -> None:
        """Each item's end-to-end time; items without a producer timestamp (0) are left out."""
        observe = self._e2e.observe
        for item in batch.items:
            if item.produced_ms > 0:
                observe(max(0, completed_ms - item.produced_ms) / 1000)

    def hooks(self) -> dict[str, Any]:
        """The app's ``on_engine`` and ``on_completed`` arguments."""
        return {"on_engine": self.engine_ran, "on_completed": self.completed}

    def kafka_conf(self, conf: Mapping[str, str]) -> dict[str, Any]:
        """``conf`` reporting librdkafka's statistics to this registry (processor.ops.kafka_stats)."""
        return self.kafka.attach(conf)

    def watch(self, app: ConsumerApp) -> None:
        self.registry.register(ConsumerAppCollector(app, self.kafka))


class ConsumerAppCollector(Collector):
    """``app.stats`` as counters (the app replaces ``stats`` when ``run`` starts: read it each time),
    its ratios, and its lag from its Kafka consumer's statistics."""

    def __init__(self, app: ConsumerApp, kafka: KafkaStats | None = None) -> None:
        self.app = app
        self.kafka = kafka

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
            (
                "dead_lettered_batches",
                "Undecodable batches sent to the dead-letter topic.",
                stats.dead_lettered,
            ),
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
        waste = GaugeMetricFamily(
            "tokenfabric_consumer_app_padding_waste_ratio",
            "Fraction of the padded tokens the engine ran that were padding: 1 - input / padded.",
            labels=labels,
        )
        engine_waste = padding_waste(stats.input_tokens, stats.padded_tokens)
        if engine_waste is not None:
            waste.add_metric(key, engine_waste)
        yield waste
        hits = GaugeMetricFamily(
            "tokenfabric_consumer_app_cache_hit_ratio",
            "Fraction of the batches the engine ran that it served from its prefix cache.",
            labels=labels,
        )
        if stats.cache_lookups > 0:
            hits.add_metric(key, stats.cache_hits / stats.cache_lookups)
        yield hits
        lag = GaugeMetricFamily(
            "tokenfabric_consumer_app_lag_batches",
            "Batches on the consumer's batch topic it has not read yet (librdkafka's consumer lag, "
            "summed over the topic's partitions; absent until the first statistics arrive).",
            labels=labels,
        )
        topic = self.app.batch_topic
        known = [] if self.kafka is None else list(self.kafka.clients.values())
        lags = [n for c in known for t, _p, n in c.lag if t == topic]
        if lags:
            lag.add_metric(key, sum(lags))
        yield lag
