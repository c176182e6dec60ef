"""A consumer app's Prometheus registry: its counters, read per scrape, engine time per batch, end to
end latency per item, its Kafka clients' statistics, and its lag in batches."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from processor.apps.consumer import ConsumerApp
from processor.core.measures import padding_waste
from processor.kafka.factory import ConsumerClient
from processor.ops.histograms import FastHistograms
from processor.ops.kafka_stats import STATS_INTERVAL_MS, KafkaStats, Position
from processor.ops.metrics import with_process_metrics
from processor.wire.records import BatchRecord

log = logging.getLogger("tokenfabric.metrics")

#: The longest one count of unread batches reads for (they are few: at most the consumer's in-flight
#: limit, since the processor sends no more).
COUNT_TIMEOUT_S = 2.0

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
        """The app's ``on_engine`` and ``on_completed`` hooks: ``ConsumerHooks(**metrics.hooks())``."""
        return {"on_engine": self.engine_ran, "on_completed": self.completed}

    def kafka_conf(self, conf: Mapping[str, str]) -> dict[str, Any]:
        """``conf`` reporting librdkafka's statistics to this registry (processor.ops.kafka_stats)."""
        return self.kafka.attach(conf)

    def watch(self, app: ConsumerApp) -> None:
        self.registry.register(ConsumerAppCollector(app, self.kafka))


def without_statistics(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` without librdkafka's statistics callback and interval: for a client of our own (the
    lag counter's reader) that must not report to the app's statistics, where its position on the
    batch topic would count as the app's (its lag read 23 batches on a drained consumer)."""
    return {k: v for k, v in conf.items() if k not in ("stats_cb", "statistics.interval.ms")}


class UnreadBatches:
    """Batches between a consumer app's position and the last stable offset of its batch topic.

    Why count rather than subtract: the processor writes batches in transactions, and each commit
    leaves a marker that takes an offset, so offsets overstate batches (by up to one per batch).
    The batches are few (the processor sends at most the consumer's in-flight limit ahead of its
    answers), so reading them back is cheap; a count is kept until the position or the end moves.
    Reads with the app's own client factory, from the scrape thread, under a lock.
    """

    def __init__(self, app: ConsumerApp) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._consumer: ConsumerClient | None = None
        self._counted: dict[Position, int] = {}

    def count(self, at: Position) -> int | None:
        """Batch records in ``[at.position, at.stable_end)``; None when they cannot be read now."""
        if at.position >= at.stable_end:
            return 0
        with self._lock:
            known = self._counted.get(at)
            if known is None:
                try:
                    known = self._read(at)
                except (KafkaException, RuntimeError) as exc:
                    log.warning("unread batches of %s not counted: %s", at.topic, exc)
                    return None
                self._counted = {at: known}  # the older positions are of no more use
            return known

    def _read(self, at: Position) -> int:
        consumer = self._reader()
        consumer.assign([TopicPartition(at.topic, at.partition, at.position)])
        deadline = time.monotonic() + COUNT_TIMEOUT_S
        records = 0
        while time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.1):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return records
                    raise KafkaException(error)
                if msg.offset() < at.stable_end:
                    records += 1
                if msg.offset() + 1 >= at.stable_end:
                    return records
        raise RuntimeError(f"no end of {at.topic} within {COUNT_TIMEOUT_S:g} s")

    def _reader(self) -> ConsumerClient:
        if self._consumer is None:
            self._consumer = self.app.clients.consumer(
                {
                    **without_statistics(self.app.conf),
                    "group.id": f"tokenfabric-lag-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": "false",
                    "enable.partition.eof": "true",
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": "50",
                }
            )
        return self._consumer


class ConsumerAppCollector(Collector):
    """``app.stats`` as counters (the app replaces ``stats`` when ``run`` starts: read it each time),
    its ratios, and its lag in batches (its Kafka consumer's position, from the statistics, to its
    batch topic's end, counted by :class:`UnreadBatches`)."""

    def __init__(self, app: ConsumerApp, kafka: KafkaStats | None = None) -> None:
        self.app = app
        self.kafka = kafka
        self.unread = UnreadBatches(app)

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
            "Batches on the consumer's batch topic after its position (commit markers not counted; "
            "absent until the first statistics give its position, or while they cannot be read).",
            labels=labels,
        )
        topic = self.app.batch_topic
        known = [] if self.kafka is None else list(self.kafka.clients.values())
        counts = [self.unread.count(at) for c in known for at in c.positions if at.topic == topic]
        if counts and None not in counts:
            lag.add_metric(key, sum(n for n in counts if n is not None))
        yield lag
