"""Prometheus metrics of the processor and of a consumer app, computed when Prometheus scrapes.

Why a custom collector rather than counters bumped on the hot path: the processor's state already
lives in plain objects that one owner thread writes (the ledger, the lane table, the consumers'
states, ``ServiceCounters``). Reading them at scrape time, from the HTTP server's thread, costs the
owner thread only the GIL time of a scrape (1.9 ms measured with 200,000 waiting items and 20
consumers), and can never drift from what the ledger and ``status`` say. Reading an ``int``
attribute another thread writes is safe under the GIL; the one care needed is copying a dict before
iterating it (:func:`~processor.ops.histograms.copy_items`), since the owner thread may add a key
meanwhile. Values may be up to one step old and the figures of one scrape are not one atomic
snapshot (see ``ledger_imbalance`` below).

The histograms are observed as events instead (processor.ops.histograms); :func:`processor_registry`
puts both in one registry.

Names and meanings: docs/metrics.md (keep the two in step; tests/ops/test_metrics.py checks it).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from processor import __version__
from processor.apps.observe import ServiceCounters, ServiceObserver, ServiceStatus
from processor.core.accounting import RECEIVED, ROUTED, ConsumerBook, Equation, ModelBook
from processor.core.measures import padding_waste
from processor.kafka.factory import ClientFactory
from processor.kafka.topics import TopicNames
from processor.ops.histograms import ServiceLatency
from processor.ops.metrics_tables import (
    CONSUMER_BOOKS,
    CONSUMER_PROMPTS,
    CONSUMER_STATES,
    LANES,
    MODEL_PROMPTS,
    MODEL_STAGES,
    books_before,
    families,
    gross,
    job_families,
)
from processor.ops.pipeline_view import PipelineCollector, PipelineReader

if TYPE_CHECKING:
    from processor.apps.settings import ProcessorSettings
    from processor.core.scheduler import Scheduler

#: Arrivals examined per model when looking for the oldest waiting item (see ``_oldest_waiting_ms``).
OLDEST_SCAN_LIMIT = 100_000


#: ``ServiceCounters`` field -> (metric name, help). Fields the service lacks are skipped.
SERVICE_COUNTERS: dict[str, tuple[str, str]] = {
    "consumed": ("tokenfabric_ingest_messages_total", "Ingest messages taken, valid or not."),
    "batches_produced": ("tokenfabric_produced_batches_total", "Batches handed to the Kafka producer."),
    "batches_delivered": (
        "tokenfabric_delivered_batches_total",
        "Batches the broker acknowledged: each one's delivery report (at-least-once), or the commit of "
        "the transaction holding it (exactly-once).",
    ),
    "completions": (
        "tokenfabric_completions_total",
        "Item completions read from the results topic (a CompletionBatch counts each item).",
    ),
    "unknown_completions": (
        "tokenfabric_unknown_completions_total",
        "Completions of batches this incarnation made and neither holds nor handed over (not replays): "
        "a consumer ran a batch again after its completion counted.",
    ),
    "foreign_completions": (
        "tokenfabric_foreign_completions_total",
        "Completions of batches this incarnation does not hold and did not make, or handed over with "
        "their partition: normal with several instances (each reads the whole results topic).",
    ),
    "contracts": ("tokenfabric_contract_announcements_total", "Consumer contract announcements read."),
    "commits": ("tokenfabric_offset_commits_total", "Successful ingest offset commits."),
    "checkpoints": ("tokenfabric_checkpoints_total", "Ledger checkpoints produced to the accounting topic."),
    "backpressure_pauses": (
        "tokenfabric_backpressure_pauses_total",
        "Times ingest was paused because waiting tokens reached --max-waiting-tokens.",
    ),
}


class ServiceView(Protocol):
    """What the collector reads of a :class:`processor.apps.service.ProcessorService` (tests pass fakes).

    ``conf``, ``topics``, ``clients`` and ``settings.group_id`` build the pipeline view's reader
    (processor.ops.pipeline_view). The scheduler is read through ``core.view``; the ingest partitions
    owned and their lag through ``status``, which the service takes on its own thread (the collector
    calls no Kafka client of the service: librdkafka clients belong to the thread that polls them).
    """

    core: Scheduler
    counters: ServiceCounters
    last_step_s: float
    last_broker_ok_s: float
    ledger_error: str | None
    observer: ServiceObserver
    conf: dict[str, str]
    topics: TopicNames
    clients: ClientFactory
    settings: ProcessorSettings

    @property
    def status(self) -> ServiceStatus: ...

    def now_ms(self) -> int: ...


def _consistent(read: Callable[[], int], tries: int = 3) -> int:
    """``read()`` until it gives 0, at most ``tries`` times, yielding the GIL in between.

    A difference of two ledger counters read from another thread can catch the owner thread between
    the two ``add`` calls of one ledger event; a real imbalance stays put, a torn read does not.
    """
    value = read()
    for _ in range(tries - 1):
        if value == 0:
            break
        time.sleep(0)
        value = read()
    return value


class BuildInfo(Collector):
    """``tokenfabric_build_info{version}``: 1, to join other series on the running version."""

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        yield InfoMetricFamily(
            "tokenfabric_build", "The running tokenfabric.", value={"version": __version__}
        )


class ProcessorCollector(Collector):
    """Every processor metric except the latency histograms, read from ``service`` per scrape."""

    def __init__(self, service: ServiceView, clock: Callable[[], float] = time.monotonic) -> None:
        self.service = service
        self.clock = clock  # must be the service's clock: last_step_s and last_broker_ok_s are on it

    def describe(self) -> Iterable[Metric]:
        return ()  # names depend on the service's state; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        yield from self._ledger()
        yield from self._consumers()
        yield from self._lanes()
        yield from self._service()
        yield from self._jobs()

    # -- the ledger ---------------------------------------------------------------------------

    def _ledger(self) -> Iterator[Metric]:
        view = self.service.core.view
        models = [((model,), book) for model, book in view.model_books()]
        before = view.counted_before()
        earlier = books_before(before.models)
        yield from families(MODEL_STAGES, models, ["model"], earlier)
        if view.prompts_counted():
            yield from families(MODEL_PROMPTS, models, ["model"], earlier)
        dead = CounterMetricFamily(
            "tokenfabric_dead_lettered_messages",
            "Ingest messages this process dead-lettered (undecodable or invalid).",
        )
        dead.add_metric([], view.dead_lettered() - before.dead_lettered)
        yield dead
        imbalance = GaugeMetricFamily(
            "tokenfabric_ledger_imbalance_tokens",
            "Tokens by which a ledger equation fails: equation=received is received + adopted_queued "
            "- queued - routed - released_queued, equation=routed is routed + adopted_in_flight "
            "- completed - in_flight - failed - released_in_flight. Must read 0.",
            labels=["model", "equation"],
        )
        for (model,), book in models:
            for equation in (RECEIVED, ROUTED):
                gap = functools.partial(_gap_tokens, equation, book)
                imbalance.add_metric([model, equation.name], _consistent(gap))
        yield imbalance
        ok = GaugeMetricFamily(
            "tokenfabric_ledger_ok", "1 while the last ledger check passed, 0 after one failed (see /readyz)."
        )
        ok.add_metric([], 1 if self.service.ledger_error is None else 0)
        yield ok

    # -- consumers ----------------------------------------------------------------------------

    def _consumers(self) -> Iterator[Metric]:
        view = self.service.core.view
        books = view.consumer_books()
        rows = [((consumer,), book) for consumer, book in books]
        earlier = books_before(view.counted_before().consumers)
        yield from families(CONSUMER_BOOKS, rows, ["consumer"], earlier)
        if view.prompts_counted():  # else no consumer reported any: nothing true to export
            yield from families(CONSUMER_PROMPTS, rows, ["consumer"], earlier)
        yield from _ratios(books)
        states = [((name, c.contract.model), c) for name, c in view.consumers().items()]
        yield from families(CONSUMER_STATES, states, ["consumer", "model"])

    # -- lanes and waiting work ---------------------------------------------------------------

    def _lanes(self) -> Iterator[Metric]:
        core = self.service.core
        yield from families(LANES, [((), core.view.lanes())])
        unserved = GaugeMetricFamily(
            "tokenfabric_unserved_waiting_items",
            "Items waiting for a model no announced consumer serves: work nobody can take.",
            labels=["model"],
        )
        for model, (items, _tokens) in sorted(core.unserved().items()):
            unserved.add_metric([model], items)
        yield unserved
        oldest = GaugeMetricFamily(
            "tokenfabric_oldest_waiting_age_seconds",
            "How long the oldest item still waiting has waited (0 when none waits).",
            labels=["model"],
        )
        now = self.service.now_ms()
        for model, arrival_ms in _oldest_waiting_ms(core).items():
            oldest.add_metric([model], max(0.0, (now - arrival_ms) / 1000) if arrival_ms is not None else 0.0)
        yield oldest

    # -- the service --------------------------------------------------------------------------

    def _service(self) -> Iterator[Metric]:
        s = self.service
        for field, (name, doc) in SERVICE_COUNTERS.items():
            value = getattr(s.counters, field, None)
            if isinstance(value, int):
                fam = CounterMetricFamily(name.removesuffix("_total"), doc)
                fam.add_metric([], value)
                yield fam
        status = s.status  # taken on the service's thread: no Kafka client is called from this one
        lag = GaugeMetricFamily(
            "tokenfabric_ingest_lag_messages",
            "Ingest messages this instance has not consumed yet, per partition it owns now (a partition "
            "it gave up leaves at once; the group's view: tokenfabric_pipeline_ingest_lag_messages).",
            labels=["partition"],
        )
        for partition, messages in status.lag:
            lag.add_metric([str(partition)], messages)
        yield lag
        count = GaugeMetricFamily(
            "tokenfabric_ingest_owned_partitions", "Ingest partitions this instance owns now."
        )
        count.add_metric([], len(status.owned))
        yield count
        now = self.clock()
        step = GaugeMetricFamily(
            "tokenfabric_step_age_seconds", "Seconds since the owner loop last completed a step (/healthz)."
        )
        step.add_metric([], max(0.0, now - s.last_step_s))
        yield step
        broker = GaugeMetricFamily(
            "tokenfabric_broker_answer_age_seconds", "Seconds since the broker last answered (/readyz)."
        )
        broker.add_metric([], max(0.0, now - s.last_broker_ok_s))
        yield broker
        paused = GaugeMetricFamily(
            "tokenfabric_ingest_paused", "1 while ingest is paused by backpressure (--max-waiting-tokens)."
        )
        paused.add_metric([], int(getattr(s, "ingest_paused", False)))
        yield paused

    # -- jobs (docs/shares.md) -----------------------------------------------------------------

    def _jobs(self) -> Iterator[Metric]:
        """Per job: tokens at each ledger stage, padded tokens, and its share policy and cap state."""
        return job_families(self.service.core.view, self.service.now_ms())


def _ratios(books: list[tuple[str, ConsumerBook]]) -> Iterator[Metric]:
    """Padding waste and cache hits as ready-made fractions, per consumer and over all of them.

    Since the ledger began (carried across restarts under exactly-once); a series is left out while
    its denominator is 0. For a figure over a recent window, divide the ``rate()`` of the counters.
    """
    waste = GaugeMetricFamily(
        "tokenfabric_consumer_padding_waste_ratio",
        "Fraction of the padded tokens sent to the consumer that were padding: 1 - real / padded.",
        labels=["consumer"],
    )
    hits = GaugeMetricFamily(
        "tokenfabric_consumer_cache_hit_ratio",
        "Fraction of the consumer's answered batches its engine served from its prefix cache.",
        labels=["consumer"],
    )
    real = padded = hit = lookups = 0
    for consumer, book in books:
        real_tokens = gross(book).tokens
        consumer_waste = padding_waste(real_tokens, book.padded_tokens)
        if consumer_waste is not None:
            waste.add_metric([consumer], consumer_waste)
        if book.cache_lookups > 0:
            hits.add_metric([consumer], book.cache_hits / book.cache_lookups)
        real, padded = real + real_tokens, padded + book.padded_tokens
        hit, lookups = hit + book.cache_hits, lookups + book.cache_lookups
    yield waste
    yield hits
    all_waste = GaugeMetricFamily(
        "tokenfabric_padding_waste_ratio", "Padding waste over every consumer: 1 - real / padded tokens."
    )
    total_waste = padding_waste(real, padded)
    if total_waste is not None:
        all_waste.add_metric([], total_waste)
    yield all_waste
    all_hits = GaugeMetricFamily(
        "tokenfabric_cache_hit_ratio", "Prefix-cache hits over every consumer's answered batches."
    )
    if lookups > 0:
        all_hits.add_metric([], hit / lookups)
    yield all_hits


def _gap_tokens(equation: Equation, book: ModelBook) -> int:
    return equation.gap(book).tokens


def _oldest_waiting_ms(core: Scheduler) -> dict[str, int | None]:
    """Arrival time (core ms) of the oldest item still waiting, per model; None when none waits.

    The scheduler keeps each model's items in arrival order and drops dispatched ones from the left
    lazily, so the first not-yet-dispatched item is nearly always at the front. The scan skips
    dispatched items without removing them (the owner thread owns the deque), stops after
    ``OLDEST_SCAN_LIMIT`` items, and gives up on a model whose deque changes under it three times.
    A model with nothing queued is answered from the ledger without looking at its deque.
    """
    out: dict[str, int | None] = {}
    for model, book in core.view.model_books():
        if book.queued.items <= 0:
            out[model] = None
            continue
        for _ in range(3):
            try:
                out[model] = core.oldest_waiting_ms(model, OLDEST_SCAN_LIMIT)
            except RuntimeError:  # "deque mutated during iteration": the owner thread moved on
                continue
            break
    return out


def with_process_metrics(registry: CollectorRegistry) -> CollectorRegistry:
    """Add the process, platform and GC collectors (CPU, memory, open fds, Python version) and
    ``tokenfabric_build_info``."""
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, BuildInfo()):
        registry.register(collector)
    return registry


def pipeline_collector(service: ServiceView, background: bool = True) -> PipelineCollector:
    """The pipeline's view (processor.ops.pipeline_view), read with the service's own client factory
    and settings: the processors' group, the pipeline's topics."""
    reader = PipelineReader(service.conf, service.topics, service.settings.group_id, service.clients)
    return PipelineCollector(reader, background=background)


def processor_registry(
    service: ServiceView,
    clock: Callable[[], float] = time.monotonic,
    extra: Iterable[Collector] = (),
    pipeline_in_background: bool = True,
) -> CollectorRegistry:
    """A registry with every processor metric, the pipeline's view, and ``service.observer`` feeding
    its histograms.

    ``extra``: more collectors, such as the librdkafka statistics of the service's clients
    (processor.ops.kafka_stats). ``pipeline_in_background``: read the pipeline's view in its own
    thread (False: in each scrape, for the in-memory Kafka of tests). A registry per service rather
    than the global one, so tests can run several side by side.
    """
    registry = with_process_metrics(CollectorRegistry(auto_describe=False))
    registry.register(ProcessorCollector(service, clock))
    registry.register(pipeline_collector(service, pipeline_in_background))
    for collector in extra:
        registry.register(collector)
    service.observer = ServiceLatency(registry)
    return registry
