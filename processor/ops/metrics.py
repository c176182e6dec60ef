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
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from processor import __version__
from processor.apps.observe import ServiceCounters, ServiceObserver
from processor.core.accounting import ENDINGS, RECEIVED, ROUTED, ConsumerBook, Equation, ModelBook, Tally
from processor.core.measures import padding_waste
from processor.kafka.factory import ClientFactory, ConsumerClient
from processor.kafka.topics import TopicNames
from processor.ops.histograms import ServiceLatency, copy_items
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
        "Completions of batches made under this instance id that it does not hold (not replays): a "
        "consumer ran a batch again after its completion counted, or an earlier incarnation's batch.",
    ),
    "foreign_completions": (
        "tokenfabric_foreign_completions_total",
        "Completions of other instances' batches that this one does not hold: normal with several "
        "instances (each reads the whole results topic).",
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
    (processor.ops.pipeline_view); ``ingest`` is asked for its assignment in at-least-once mode only.
    """

    core: Scheduler
    counters: ServiceCounters
    lag: dict[int, int]
    last_step_s: float
    last_broker_ok_s: float
    ledger_error: str | None
    observer: ServiceObserver
    conf: dict[str, str]
    topics: TopicNames
    clients: ClientFactory
    settings: ProcessorSettings
    ingest: ConsumerClient

    @property
    def owned(self) -> frozenset[int]: ...

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
        ledger = self.service.core.ledger
        models = copy_items(ledger.models)
        # Received, completed and failed only grow (counters); the others go down as items move on.
        for family, stage, doc in (
            (CounterMetricFamily, "received", "taken from the ingest topic"),
            (CounterMetricFamily, "completed", "completed ok by a consumer"),
            (CounterMetricFamily, "failed", "answered failed or rejected by a consumer"),
            (GaugeMetricFamily, "queued", "waiting in lanes"),
            (
                GaugeMetricFamily,
                "routed",
                "sent to a consumer and not handed back (net: a retiring consumer's batches return)",
            ),
            (GaugeMetricFamily, "in_flight", "sent to a consumer and not answered yet"),
        ):
            for unit in ("items", "tokens"):
                fam = family(f"tokenfabric_{stage}_{unit}", f"Prompt {unit} {doc}.", labels=["model"])
                for model, book in models:
                    fam.add_metric([model], getattr(getattr(book, stage), unit))
                yield fam
        if ledger.prompts_counted:
            for counter, doc in (
                ("cached_prompt_tokens", "served from the engines' prefix caches (measured by the servers)"),
                ("prefill_tokens", "computed by the engines (prefill)"),
            ):
                fam = CounterMetricFamily(
                    f"tokenfabric_{counter}", f"Prompt tokens of items completed ok, {doc}.", labels=["model"]
                )
                for model, book in models:
                    fam.add_metric([model], getattr(book, counter))
                yield fam
        dead = CounterMetricFamily(
            "tokenfabric_dead_lettered_messages", "Ingest messages dead-lettered (undecodable or invalid)."
        )
        dead.add_metric([], ledger.dead_lettered)
        yield dead
        imbalance = GaugeMetricFamily(
            "tokenfabric_ledger_imbalance_tokens",
            "Tokens by which a ledger equation fails: equation=received is received + adopted_queued "
            "- queued - routed - released_queued, equation=routed is routed + adopted_in_flight "
            "- completed - in_flight - failed - released_in_flight. Must read 0.",
            labels=["model", "equation"],
        )
        for model, book in models:
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
        core = self.service.core
        books = copy_items(core.ledger.consumers)
        label = ["consumer"]

        def per_book(
            name: str, doc: str, value: Callable[[ConsumerBook], int], counter: bool = True
        ) -> Metric:
            cls = CounterMetricFamily if counter else GaugeMetricFamily
            fam = cls(name, doc, labels=label)
            for consumer, book in books:
                fam.add_metric([consumer], value(book))
            return fam

        yield per_book(
            "tokenfabric_consumer_routed_items",
            "Items sent to the consumer, counting again those sent once more after a retirement.",
            lambda b: _gross(b).items,
        )
        yield per_book(
            "tokenfabric_consumer_real_tokens",
            "Prompt tokens in batches sent to the consumer (the numerator of padding efficiency).",
            lambda b: _gross(b).tokens,
        )
        yield per_book(
            "tokenfabric_consumer_padded_tokens",
            "Padded tokens of batches sent to the consumer: items x padded length (what the GPU pays).",
            lambda b: b.padded_tokens,
        )
        yield per_book(
            "tokenfabric_consumer_routed_batches", "Batches sent to the consumer.", lambda b: b.batches
        )
        yield per_book(
            "tokenfabric_consumer_oversized_batches",
            "Single-item batches whose padded length exceeds the consumer's budget.",
            lambda b: b.oversized,
        )
        for stage, doc in (
            ("completed", "completed ok"),
            ("failed", "answered failed or rejected"),
            ("redelivered", "handed back when the consumer retired, to be sent again"),
        ):
            for unit in ("items", "tokens"):
                yield per_book(
                    f"tokenfabric_consumer_{stage}_{unit}",
                    f"Prompt {unit} of the consumer's batches {doc}.",
                    operator.attrgetter(f"{stage}.{unit}"),
                )
        for unit in ("items", "tokens"):
            yield per_book(
                f"tokenfabric_consumer_in_flight_{unit}",
                f"Prompt {unit} sent to the consumer and not answered yet.",
                operator.attrgetter(f"in_flight.{unit}"),
                counter=False,
            )
        yield per_book(
            "tokenfabric_consumer_cache_hits",
            "Batches whose engine reported a prefix-cache hit for the batch's shape.",
            lambda b: b.cache_hits,
        )
        yield per_book(
            "tokenfabric_consumer_cache_lookups",
            "Batches answered, each one prefix-cache lookup of its shape.",
            lambda b: b.cache_lookups,
        )
        if core.ledger.prompts_counted:  # else no consumer reported any: nothing true to export
            yield per_book(
                "tokenfabric_consumer_cached_prompt_tokens",
                "Prompt tokens of items completed ok that the consumer's engine served from its prefix "
                "cache (measured by its server).",
                lambda b: b.cached_prompt_tokens,
            )
            yield per_book(
                "tokenfabric_consumer_prefill_tokens",
                "Prompt tokens of items completed ok that the consumer's engine computed.",
                lambda b: b.prefill_tokens,
            )
        yield from _ratios(books)

        states = core.view.consumers().items()
        labels = ["consumer", "model"]
        switches = CounterMetricFamily(
            "tokenfabric_consumer_shape_switches",
            "Times the consumer was moved to another shape (each costs its prefix cache).",
            labels=labels,
        )
        batches = GaugeMetricFamily(
            "tokenfabric_consumer_in_flight_batches", "Batches the consumer holds.", labels=labels
        )
        slots = GaugeMetricFamily(
            "tokenfabric_consumer_free_slots", "In-flight slots the consumer has free.", labels=labels
        )
        budget = GaugeMetricFamily(
            "tokenfabric_consumer_budget_tokens",
            "The consumer's contract: padded tokens per batch.",
            labels=labels,
        )
        for consumer, state in states:
            key = [consumer, state.contract.model]
            switches.add_metric(key, state.shape_switches)
            batches.add_metric(key, state.in_flight)
            slots.add_metric(key, state.free_slots)
            budget.add_metric(key, state.contract.budget_tokens)
        yield from (switches, batches, slots, budget)

    # -- lanes and waiting work ---------------------------------------------------------------

    def _lanes(self) -> Iterator[Metric]:
        st = self.service.core.view.lanes()
        for name, doc, value in (
            ("tokenfabric_lanes_reused", "Items placed in an existing lane.", st.reuses),
            ("tokenfabric_lanes_opened", "Lanes opened.", st.new_lanes),
            ("tokenfabric_lanes_id_reused", "Lanes opened under the id of a reclaimed one.", st.id_reuses),
            ("tokenfabric_lanes_idle_reclaimed", "Empty lanes retired after going quiet.", st.idle_reclaims),
        ):
            fam = CounterMetricFamily(name, doc)
            fam.add_metric([], value)
            yield fam
        for name, doc, level in (
            ("tokenfabric_lanes_in_use", "Lanes that exist now, all shapes.", st.lanes_in_use),
            ("tokenfabric_lanes_in_use_peak", "Most lanes in use at once.", st.lanes_in_use_peak),
            ("tokenfabric_lanes_budget", "Lanes allowed per (model, shape).", st.lane_budget),
            ("tokenfabric_lanes_shapes", "(model, shape) pairs holding lanes.", st.shapes),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], level)
            yield gauge
        core = self.service.core
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
        for model, arrival_ms in _oldest_waiting_ms(self.service.core).items():
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
        owned = owned_partitions(s)
        lag = GaugeMetricFamily(
            "tokenfabric_ingest_lag_messages",
            "Ingest messages this instance has not consumed yet, per partition it owns now (a partition "
            "it gave up leaves at once; the group's view: tokenfabric_pipeline_ingest_lag_messages).",
            labels=["partition"],
        )
        for partition, messages in sorted(copy_items(s.lag)):
            if partition in owned:
                lag.add_metric([str(partition)], messages)
        yield lag
        count = GaugeMetricFamily(
            "tokenfabric_ingest_owned_partitions", "Ingest partitions this instance owns now."
        )
        count.add_metric([], len(owned))
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
        core = self.service.core
        books = copy_items(core.ledger.jobs)
        tokens = GaugeMetricFamily(
            "tokenfabric_job_tokens",
            "Prompt tokens of a job at a ledger stage (received, queued, routed, in_flight, completed, "
            "failed, cancelled, expired, retried; routed is net of requeues), and of its completed prompts, "
            "cached_prompt and prefill (where consumers report them).",
            labels=["job", "stage"],
        )
        padded = CounterMetricFamily(
            "tokenfabric_job_padded_tokens", "Padded tokens of the batches routed for a job.", labels=["job"]
        )
        for job, book in books:
            for stage in (
                "received",
                "queued",
                "routed",
                "in_flight",
                "completed",
                "failed",
                *ENDINGS,
                "retried",
            ):
                tokens.add_metric([job, stage], getattr(book, stage).tokens)
            if core.ledger.prompts_counted:
                tokens.add_metric([job, "cached_prompt"], book.cached_prompt_tokens)
                tokens.add_metric([job, "prefill"], book.prefill_tokens)
            padded.add_metric([job], book.padded_tokens)
        yield tokens
        yield padded
        shares = core.shares
        now = self.service.now_ms()
        weight = GaugeMetricFamily(
            "tokenfabric_job_weight", "A job's weight (docs/shares.md).", labels=["job"]
        )
        rate = GaugeMetricFamily(
            "tokenfabric_job_quota_tokens_per_second",
            "A job's cap in routed tokens/s; -1: none.",
            labels=["job"],
        )
        total = GaugeMetricFamily(
            "tokenfabric_job_quota_tokens", "A job's cap in routed tokens in all; -1: none.", labels=["job"]
        )
        capped = GaugeMetricFamily(
            "tokenfabric_job_capped",
            "1 while a quota holds the job's items back (they wait).",
            labels=["job"],
        )
        for job in list(shares.jobs()):
            p = shares.policy(job)
            weight.add_metric([job], p.weight)
            rate.add_metric([job], -1 if p.max_tokens_per_s is None else p.max_tokens_per_s)
            total.add_metric([job], -1 if p.max_tokens is None else p.max_tokens)
            capped.add_metric([job], int(p.capped and shares.capped_now(job, now)))
        yield from (weight, rate, total, capped)


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
        gross = _gross(book).tokens
        consumer_waste = padding_waste(gross, book.padded_tokens)
        if consumer_waste is not None:
            waste.add_metric([consumer], consumer_waste)
        if book.cache_lookups > 0:
            hits.add_metric([consumer], book.cache_hits / book.cache_lookups)
        real, padded = real + gross, padded + book.padded_tokens
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


def _gross(book: ConsumerBook) -> Tally:
    """Routed counting every send: the ledger's net ``routed`` plus what came back ``redelivered``.

    The ledger moves a retiring consumer's batches from ``routed`` back to ``queued``; a Prometheus
    counter must never go down, so the per-consumer counter adds them back.
    """
    routed, again = book.routed, book.redelivered
    return Tally(routed.items + again.items, routed.tokens + again.tokens)


def _oldest_waiting_ms(core: Scheduler) -> dict[str, int | None]:
    """Arrival time (core ms) of the oldest item still waiting, per model; None when none waits.

    The scheduler keeps each model's items in arrival order and drops dispatched ones from the left
    lazily, so the first not-yet-dispatched item is nearly always at the front. The scan skips
    dispatched items without removing them (the owner thread owns the deque), stops after
    ``OLDEST_SCAN_LIMIT`` items, and gives up on a model whose deque changes under it three times.
    A model with nothing queued is answered from the ledger without looking at its deque.
    """
    out: dict[str, int | None] = {}
    for model, book in copy_items(core.ledger.models):
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


def owned_partitions(service: ServiceView) -> frozenset[int]:
    """The ingest partitions ``service`` owns now: the handover's (exactly-once: set when their lane
    state is restored, emptied on revocation), or the consumer's assignment (at-least-once, where no
    lane state moves). A closed consumer owns nothing."""
    if service.settings.exactly_once:
        return service.owned
    try:
        return frozenset(tp.partition for tp in service.ingest.assignment())
    except RuntimeError:  # "Consumer closed": the service is stopping
        return frozenset()


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
