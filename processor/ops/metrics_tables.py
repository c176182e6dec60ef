"""The processor's metric families as tables: one row per metric (name, help, where its value comes
from), and one function that turns a table and its rows into families.

Read at scrape time from the scheduler's view (processor/core/view.py); docs/metrics.md names and
explains each metric (tests/ops/test_metrics.py keeps the two in step). The families the tables do
not describe (the ledger's imbalance, the padding and cache ratios, the service's own gauges) are
built in processor/ops/metrics.py.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from processor.core.accounting import ENDINGS, ConsumerBook, JobBook, ModelBook, Tally
from processor.core.view import ConsumerSnapshot, LaneSnapshot, SchedulerView

Row = TypeVar("Row")


@dataclass(frozen=True, slots=True)
class Series(Generic[Row]):
    """One metric: its name (a counter's without ``_total``), its help, and its value in a row."""

    name: str
    help: str
    value: Callable[[Row], float]
    counter: bool = True


def families(
    table: Iterable[Series[Row]],
    rows: Sequence[tuple[Sequence[str], Row]],
    labels: Sequence[str] = (),
    before: Mapping[tuple[str, ...], Row] | None = None,
) -> Iterator[Metric]:
    """One family per series of ``table``, with a sample per ``(label values, row)`` of ``rows``.

    ``before``: the rows as the ledger resumed them from a checkpoint, by label values. A counter
    exports its row's value less that: what this process counted (docs/metrics.md, "Counters
    across restarts"), so a restored total never reads as new events to ``increase()``."""
    for series in table:
        cls = CounterMetricFamily if series.counter else GaugeMetricFamily
        fam = cls(series.name, series.help, labels=list(labels))
        value = series.value
        for key, row in rows:
            earlier = before.get(tuple(key)) if before and series.counter else None
            fam.add_metric(list(key), value(row) if earlier is None else value(row) - value(earlier))
        yield fam


def books_before(books: Mapping[str, Row]) -> dict[tuple[str, ...], Row]:
    """A resumed ledger's books (``SchedulerView.counted_before``) keyed as ``families``' ``before``."""
    return {(name,): book for name, book in books.items()}


def gross(book: ConsumerBook) -> Tally:
    """Routed counting every send: the ledger's net ``routed`` plus what came back ``redelivered``.

    The ledger moves a retiring consumer's batches from ``routed`` back to ``queued``; a Prometheus
    counter must never go down, so the per-consumer counter adds them back.
    """
    routed, again = book.routed, book.redelivered
    return Tally(routed.items + again.items, routed.tokens + again.tokens)


# -- per model (the ledger) ----------------------------------------------------------------------

#: Received, completed and failed only grow (counters); the others go down as items move on.
_MODEL_STAGES = (
    (True, "received", "taken from the ingest topic"),
    (True, "completed", "completed ok by a consumer"),
    (True, "failed", "answered failed or rejected by a consumer"),
    (False, "queued", "waiting in lanes"),
    (False, "routed", "sent to a consumer and not handed back (net: a retiring consumer's batches return)"),
    (False, "in_flight", "sent to a consumer and not answered yet"),
)

MODEL_STAGES: tuple[Series[ModelBook], ...] = tuple(
    Series(
        f"tokenfabric_{stage}_{unit}",
        f"Prompt {unit} {doc}.",
        operator.attrgetter(f"{stage}.{unit}"),
        counter,
    )
    for counter, stage, doc in _MODEL_STAGES
    for unit in ("items", "tokens")
)

MODEL_PROMPTS: tuple[Series[ModelBook], ...] = tuple(
    Series(
        f"tokenfabric_{counter}", f"Prompt tokens of items completed ok, {doc}.", operator.attrgetter(counter)
    )
    for counter, doc in (
        ("cached_prompt_tokens", "served from the engines' prefix caches (measured by the servers)"),
        ("prefill_tokens", "computed by the engines (prefill)"),
    )
)
"""Exported once a consumer reported cached prompt tokens (``SchedulerView.prompts_counted``)."""

# -- per consumer: its book, then its state --------------------------------------------------------

_STAGES = (
    ("completed", "completed ok"),
    ("failed", "answered failed or rejected"),
    ("redelivered", "handed back when the consumer retired, to be sent again"),
)

CONSUMER_BOOKS: tuple[Series[ConsumerBook], ...] = (
    Series(
        "tokenfabric_consumer_routed_items",
        "Items sent to the consumer, counting again those sent once more after a retirement.",
        lambda b: gross(b).items,
    ),
    Series(
        "tokenfabric_consumer_real_tokens",
        "Prompt tokens in batches sent to the consumer (the numerator of padding efficiency).",
        lambda b: gross(b).tokens,
    ),
    Series(
        "tokenfabric_consumer_padded_tokens",
        "Padded tokens of batches sent to the consumer: items x padded length (what the GPU pays).",
        operator.attrgetter("padded_tokens"),
    ),
    Series(
        "tokenfabric_consumer_routed_batches", "Batches sent to the consumer.", operator.attrgetter("batches")
    ),
    Series(
        "tokenfabric_consumer_oversized_batches",
        "Single-item batches whose padded length exceeds the consumer's budget.",
        operator.attrgetter("oversized"),
    ),
    *(
        Series(
            f"tokenfabric_consumer_{stage}_{unit}",
            f"Prompt {unit} of the consumer's batches {doc}.",
            operator.attrgetter(f"{stage}.{unit}"),
        )
        for stage, doc in _STAGES
        for unit in ("items", "tokens")
    ),
    *(
        Series(
            f"tokenfabric_consumer_in_flight_{unit}",
            f"Prompt {unit} sent to the consumer and not answered yet.",
            operator.attrgetter(f"in_flight.{unit}"),
            counter=False,
        )
        for unit in ("items", "tokens")
    ),
    Series(
        "tokenfabric_consumer_cache_hits",
        "Batches whose engine reported a prefix-cache hit for the batch's shape.",
        operator.attrgetter("cache_hits"),
    ),
    Series(
        "tokenfabric_consumer_cache_lookups",
        "Batches answered, each one prefix-cache lookup of its shape.",
        operator.attrgetter("cache_lookups"),
    ),
)

CONSUMER_PROMPTS: tuple[Series[ConsumerBook], ...] = (
    Series(
        "tokenfabric_consumer_cached_prompt_tokens",
        "Prompt tokens of items completed ok that the consumer's engine served from its prefix cache "
        "(measured by its server).",
        operator.attrgetter("cached_prompt_tokens"),
    ),
    Series(
        "tokenfabric_consumer_prefill_tokens",
        "Prompt tokens of items completed ok that the consumer's engine computed.",
        operator.attrgetter("prefill_tokens"),
    ),
)
"""Exported once a consumer reported cached prompt tokens (else nothing true to export)."""

CONSUMER_STATES: tuple[Series[ConsumerSnapshot], ...] = (
    Series(
        "tokenfabric_consumer_shape_switches",
        "Times the consumer was moved to another shape (each costs its prefix cache).",
        operator.attrgetter("shape_switches"),
    ),
    Series(
        "tokenfabric_consumer_in_flight_batches",
        "Batches the consumer holds.",
        operator.attrgetter("in_flight"),
        counter=False,
    ),
    Series(
        "tokenfabric_consumer_free_slots",
        "In-flight slots the consumer has free.",
        operator.attrgetter("free_slots"),
        counter=False,
    ),
    Series(
        "tokenfabric_consumer_budget_tokens",
        "The consumer's contract: padded tokens per batch.",
        operator.attrgetter("contract.budget_tokens"),
        counter=False,
    ),
)
"""Labelled by consumer and model."""

# -- lanes ---------------------------------------------------------------------------------------

LANES: tuple[Series[LaneSnapshot], ...] = (
    Series("tokenfabric_lanes_reused", "Items placed in an existing lane.", operator.attrgetter("reuses")),
    Series("tokenfabric_lanes_opened", "Lanes opened.", operator.attrgetter("new_lanes")),
    Series(
        "tokenfabric_lanes_id_reused",
        "Lanes opened under the id of a reclaimed one.",
        operator.attrgetter("id_reuses"),
    ),
    Series(
        "tokenfabric_lanes_idle_reclaimed",
        "Empty lanes retired after going quiet.",
        operator.attrgetter("idle_reclaims"),
    ),
    Series(
        "tokenfabric_lanes_in_use",
        "Lanes that exist now, all shapes.",
        operator.attrgetter("lanes_in_use"),
        counter=False,
    ),
    Series(
        "tokenfabric_lanes_in_use_peak",
        "Most lanes in use at once.",
        operator.attrgetter("lanes_in_use_peak"),
        counter=False,
    ),
    Series(
        "tokenfabric_lanes_budget",
        "Lanes allowed per (model, shape).",
        operator.attrgetter("lane_budget"),
        counter=False,
    ),
    Series(
        "tokenfabric_lanes_shapes",
        "(model, shape) pairs holding lanes.",
        operator.attrgetter("shapes"),
        counter=False,
    ),
)

# -- jobs (docs/shares.md) -------------------------------------------------------------------------

JOB_STAGES = ("received", "queued", "routed", "in_flight", "completed", "failed", *ENDINGS, "retried")
"""The ledger stages of ``tokenfabric_job_tokens``, in the order exported."""

JOB_PADDED: tuple[Series[JobBook], ...] = (
    Series(
        "tokenfabric_job_padded_tokens",
        "Padded tokens of the batches routed for a job.",
        operator.attrgetter("padded_tokens"),
    ),
)


def job_families(view: SchedulerView, now_ms: int) -> Iterator[Metric]:
    """Per job: tokens at each ledger stage, padded tokens, and its share policy and cap state."""
    tokens = GaugeMetricFamily(
        "tokenfabric_job_tokens",
        "Prompt tokens of a job at a ledger stage (received, queued, routed, in_flight, completed, "
        "failed, cancelled, expired, retried; routed is net of requeues), and of its completed prompts, "
        "cached_prompt and prefill (where consumers report them).",
        labels=["job", "stage"],
    )
    books: list[tuple[str, JobBook]] = view.job_books()
    prompts = view.prompts_counted()
    for job, book in books:
        for stage in JOB_STAGES:
            tokens.add_metric([job, stage], getattr(book, stage).tokens)
        if prompts:
            tokens.add_metric([job, "cached_prompt"], book.cached_prompt_tokens)
            tokens.add_metric([job, "prefill"], book.prefill_tokens)
    yield tokens
    before = books_before(view.counted_before().jobs)
    yield from families(JOB_PADDED, [((job,), book) for job, book in books], ["job"], before)
    jobs = view.share_jobs()
    yield from families(_job_policy(view, now_ms), [((job,), job) for job in jobs], ["job"])


def _job_policy(view: SchedulerView, now_ms: int) -> tuple[Series[str], ...]:
    """A job's share policy and cap state, read from the view by job name."""
    policy = view.policy
    return (
        Series(
            "tokenfabric_job_weight", "A job's weight (docs/shares.md).", lambda j: policy(j).weight, False
        ),
        Series(
            "tokenfabric_job_quota_tokens_per_second",
            "A job's cap in routed tokens/s; -1: none.",
            lambda j: _or_none(policy(j).max_tokens_per_s),
            False,
        ),
        Series(
            "tokenfabric_job_quota_tokens",
            "A job's cap in routed tokens in all; -1: none.",
            lambda j: _or_none(policy(j).max_tokens),
            False,
        ),
        Series(
            "tokenfabric_job_capped",
            "1 while a quota holds the job's items back (they wait).",
            lambda j: int(policy(j).capped and view.capped_now(j, now_ms)),
            False,
        ),
    )


def _or_none(value: float | None) -> float:
    return -1 if value is None else value
