"""The processor's latency and size histograms, observed as events rather than read at scrape time.

:mod:`processor.ops.metrics` reads the processor's plain objects when Prometheus scrapes; what no
object holds (how long a commit took, how long each item waited) is observed here, through the
service's :class:`ServiceObserver` hooks: a commit or a checkpoint about once a second, and, per
batch, its items' waits and its shape. The per-batch ones run on the owner thread's hot path, so
they use :class:`FastHistogram` (no locks); a scrape reads them from the HTTP server's thread.

Names and meanings: docs/metrics.md.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from processor.apps.observe import ServiceObserver
from processor.core.item import Batch

K = TypeVar("K")

V = TypeVar("V")


#: Commit of ingest offsets (or a transaction): a broker round trip, milliseconds to seconds.
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


#: Building and queueing a ledger checkpoint: in memory, microseconds to tens of milliseconds.
CHECKPOINT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


#: An item's time in a lane, ingest to dispatch: immediate to the --max-wait-ms of a quiet shape.
QUEUED_BUCKETS = (
    0.001,
    0.005,
    0.01,
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
)


#: Dispatch to completion: a commit, the consumer's fetch and engine, the results read back.
IN_FLIGHT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


#: Items per batch (max_items is commonly a power of two).
BATCH_ITEMS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


#: A batch's padded length in tokens.
PADDED_LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def copy_items(d: Mapping[K, V]) -> list[tuple[K, V]]:
    """A copy of ``d``'s items, safe while the owner thread inserts keys.

    ``list(d.items())`` runs in C without releasing the GIL for str/int keys, so it cannot see the
    dict change size; the retry is for a thread switch that a future key type could allow.
    """
    for attempt in range(3):
        try:
            return list(d.items())
        except RuntimeError:  # "dictionary changed size during iteration"
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class FastHistogram:
    """Bucket counts one thread adds to and a scrape reads, without a lock: for per-item events.

    prometheus_client's ``Histogram.observe`` takes locks per call (about 1-2 us); an item's wait is
    observed once per item on the owner thread, so this keeps a plain list instead. ``counts[i]``
    holds observations in ``(bounds[i-1], bounds[i]]``, the last one those above every bound. A
    scrape may see the sum one observation ahead of the counts: immaterial for a histogram.
    """

    __slots__ = ("bounds", "bounds_ms", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"histogram bounds must increase: {self.bounds}")
        self.bounds_ms = tuple(b * 1000 for b in self.bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def observe_ms(self, values_ms: Iterable[int]) -> None:
        """Many durations in milliseconds (observed as seconds; negative ones as 0), in one call:
        the per-item path, with no call or division per value."""
        bounds, counts, find = self.bounds_ms, self.counts, bisect.bisect_left
        total = 0
        for ms in values_ms:
            if ms < 0:
                ms = 0
            counts[find(bounds, ms)] += 1
            total += ms
        self.sum += total / 1000


class FastHistograms(Collector):
    """A family of :class:`FastHistogram` by label values, exposed as one Prometheus histogram."""

    def __init__(self, name: str, doc: str, labels: list[str], bounds: Iterable[float]) -> None:
        self.name, self.doc, self.labels, self.bounds = name, doc, labels, tuple(bounds)
        self.series: dict[tuple[str, ...], FastHistogram] = {}

    def of(self, *values: str) -> FastHistogram:
        h = self.series.get(values)
        if h is None:
            h = self.series[values] = FastHistogram(self.bounds)
        return h

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for values, h in copy_items(self.series):
            running, buckets = 0, []
            for bound, count in zip((*h.bounds, float("inf")), list(h.counts), strict=True):
                running += count
                buckets.append(("+Inf" if bound == float("inf") else _le(bound), running))
            fam.add_metric(list(values), buckets, h.sum)
        yield fam


def _le(bound: float) -> str:
    return repr(float(bound))


class ServiceLatency(ServiceObserver):
    """The service's hooks, feeding the commit, checkpoint, item and batch histograms.

    ``dispatched`` and ``answered`` run on the owner thread for every batch: they cost one
    :class:`FastHistogram` add per item (its wait) and a few per batch.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.commit = Histogram(
            "tokenfabric_commit_seconds",
            "Time to commit ingest offsets (or the transaction, with exactly-once).",
            buckets=COMMIT_BUCKETS,
            registry=registry,
        )
        self.checkpoint = Histogram(
            "tokenfabric_checkpoint_seconds",
            "Time to build and queue one ledger checkpoint.",
            buckets=CHECKPOINT_BUCKETS,
            registry=registry,
        )
        self.queued = FastHistograms(
            "tokenfabric_item_queued_seconds",
            "An item's wait from ingest (taken from the ingest topic) to dispatch (in a batch).",
            ["model"],
            QUEUED_BUCKETS,
        )
        self.in_flight = FastHistograms(
            "tokenfabric_item_in_flight_seconds",
            "An item's time from dispatch to its completion being read back from the results topic.",
            ["model"],
            IN_FLIGHT_BUCKETS,
        )
        self.batch_items = FastHistograms(
            "tokenfabric_batch_size_items", "Items per batch sent.", ["consumer"], BATCH_ITEMS_BUCKETS
        )
        self.padded_length = FastHistograms(
            "tokenfabric_batch_padded_length_tokens",
            "Padded length of each batch sent (every item is padded to it).",
            ["consumer"],
            PADDED_LENGTH_BUCKETS,
        )
        for collector in (self.queued, self.in_flight, self.batch_items, self.padded_length):
            registry.register(collector)

    def committed(self, seconds: float) -> None:
        self.commit.observe(seconds)

    def checkpointed(self, seconds: float) -> None:
        self.checkpoint.observe(seconds)

    def dispatched(self, batch: Batch, now_ms: int) -> None:
        # negative waits (restored items may carry another clock) count as 0
        self.queued.of(batch.model).observe_ms([now_ms - item.arrival_ms for item in batch.items])
        self.batch_items.of(batch.consumer).observe(len(batch.items))
        self.padded_length.of(batch.consumer).observe(batch.padded_length)

    def answered(self, batch: Batch, items: int, now_ms: int) -> None:
        self.in_flight.of(batch.model).observe(max(0, now_ms - batch.created_ms) / 1000, items)
