"""Gather what ``tokenfabric status`` shows and judge it: who is alive, what waits, for whom.

Everything comes from Kafka, not from a processor's memory, so status works against any cluster and
shows the same figures an audit would start from:

* contracts (compacted): who may take work, and when each consumer announced;
* ledger checkpoints (``accounting``, compacted, one key per processor instance): the ledger, the
  gauges taken beside it, and the checkpoint's wall-clock time. A running processor checkpoints with
  every commit (every 500 ms by default), so an instance whose checkpoint is older than
  ``stale_s`` (:data:`DEFAULT_STALE_S`) is marked stale: dead, stuck, or restoring for that long;
* each consumer's group on its batch topic: live members (the broker drops a member that stops
  polling within its session timeout, or at once when it closes), the committed offset, and how many
  batches lie after it (its lag, counted message by message: transaction markers take offsets too);
* the processors' ingest group: messages not yet committed past.

:func:`report` turns a :class:`StatusView` into a :class:`StatusReport`, typed, from which the CLI
prints text and ``--json`` prints :meth:`StatusReport.as_json` (its JSON Schema ships beside this
module, ``status.schema.json``; docs/operations.md describes it). The reading is
processor/ops/status_view.py, the records processor/ops/status_records.py; this module judges, and
names all three's public face.

Retiring an instance or a consumer that is gone for good writes to the topics: processor.ops.retire.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from processor.core.contract import Contract
from processor.core.ledger_keys import model_key
from processor.core.measures import budget_fill, padding_waste
from processor.kafka.topics import TopicNames
from processor.ops.status_records import (
    SCHEMA_ID,
    SCHEMA_PATH,
    ConsumerRow,
    ContractTerms,
    IngestState,
    JobRow,
    LaneFigures,
    ProcessorRow,
    PromptFigures,
    Rates,
    StatusReport,
    Tally,
    UnservedModel,
)
from processor.ops.status_view import (
    RETIRED,
    STAGES,
    GroupFacts,
    StatusView,
    consumer_groups,
    gather,
    ingest_lag,
)
from processor.wire.records import LedgerSnapshotRecord

__all__ = [
    "DEFAULT_STALE_S",
    "JOB_STAGES",
    "RETIRED",
    "SCHEMA_ID",
    "SCHEMA_PATH",
    "STAGES",
    "ConsumerRow",
    "ContractTerms",
    "GroupFacts",
    "IngestState",
    "JobRow",
    "LaneFigures",
    "ProcessorRow",
    "PromptFigures",
    "Rates",
    "StatusReport",
    "StatusView",
    "Tally",
    "UnservedModel",
    "consumer_groups",
    "consumer_row",
    "gather",
    "ingest_lag",
    "live_instances",
    "ratio",
    "report",
    "with_rates",
]

DEFAULT_STALE_S = 30.0
"""A processor checkpoint, or a consumer's last sign of life, older than this is STALE."""


def ratio(num: int, den: int) -> float | None:
    return num / den if den > 0 else None


def _age(now_ms: int, then_ms: int) -> float | None:
    return max(0.0, (now_ms - then_ms) / 1000) if then_ms > 0 else None


def live_instances(view: StatusView, stale_s: float = DEFAULT_STALE_S) -> dict[str, LedgerSnapshotRecord]:
    """The instances that checkpointed within ``stale_s`` and are not retired."""
    return {
        name: cp
        for name, cp in sorted(view.checkpoints.items())
        if not view.retired(name) and view.read_ms - cp.taken_ms <= stale_s * 1000
    }


def consumer_row(view: StatusView, name: str, c: Contract, stale_s: float) -> ConsumerRow:
    """One consumer. Its gauges (batches in flight, slots) are the live instances' only: a stale
    instance's last checkpoint still claims batches that another instance may have adopted since."""
    now = view.read_ms
    live = live_instances(view, stale_s)

    def gauge(key: str) -> int:
        return sum(cp.per_consumer.get(name, {}).get(key, 0) for cp in live.values())

    facts = view.groups.get(name, GroupFacts())
    last_completion = max((cp.per_consumer.get(name, {}).get("last_completion_ms", 0)
                           for cp in view.checkpoints.values()), default=0)  # fmt: skip
    announced = view.announced_ms.get(name, 0)
    # Read apart (group offsets, then the topic), so a batch may be counted both unread and not yet
    # in flight: the processor never has more than the contract's limit out, so neither is shown.
    unread = None if facts.unread is None else min(facts.unread, c.max_inflight)
    waiting_for_it = gauge("in_flight_batches") > 0 or bool(unread)
    answered = _age(now, max(last_completion, announced))  # the announcement starts the clock
    state: Literal["up", "silent", "down", "stale"]
    if facts.members:
        silent = waiting_for_it and answered is not None and answered > stale_s
        state, seen = ("silent", answered) if silent else ("up", 0.0)
    else:
        seen = answered
        state = "down" if seen is not None and seen <= stale_s else "stale"
    total = view.consumer_total
    batches, oversized = total(name, "batches"), total(name, "oversized")
    padded, routed = total(name, "padded_tokens"), total(name, "routed_tokens")
    in_budget = padded - total(name, "oversized_padded_tokens")
    fill = budget_fill(in_budget, (batches - oversized) * c.budget_tokens) if c.batching == "tokens" else None
    slots = {
        instance: cp.per_consumer[name]["slots"]
        for instance, cp in live.items()
        if "slots" in cp.per_consumer.get(name, {})
    }
    return ConsumerRow(
        consumer=name,
        model=c.model,
        state=state,
        members=facts.members,
        last_seen_age_s=seen,
        last_completion_age_s=_age(now, last_completion),
        announced_age_s=_age(now, announced),
        contract=ContractTerms(c.batching, c.budget_tokens, c.max_items, c.pad_multiple, c.max_inflight),
        in_flight_batches=gauge("in_flight_batches"),
        unread_batches=unread,
        slots=slots,
        routed_tokens=routed,
        completed_tokens=total(name, "completed_tokens"),
        batches=batches,
        oversized_batches=oversized,
        padding_waste=padding_waste(routed, padded),
        # Checkpoints of earlier versions lack the oversized batches' padded tokens: never past 100%.
        budget_fill=None if fill is None else min(1.0, fill),
        cache_hit_rate=ratio(total(name, "cache_hits"), total(name, "cache_lookups")),
        shape_switches=gauge("shape_switches"),
        prompts=PromptFigures.of(view, lambda key: total(name, key)),
    )


def _unserved(view: StatusView, consumers: list[ConsumerRow]) -> list[UnservedModel]:
    models = set(view.owners("model", "queued_items"))
    up = {row.model for row in consumers if row.state == "up"}
    out = []
    for model in sorted(models - up):
        items = view.held(model_key("queued_items", model))
        tokens = view.held(model_key("queued_tokens", model))
        if items > 0:
            names = sorted(row.consumer for row in consumers if row.model == model)
            out.append(UnservedModel(model, items, tokens, names))
    return out


JOB_STAGES = ("received", "queued", "routed", "completed", "failed", "padded", "cached_prompt", "prefill")


def _jobs(view: StatusView) -> list[JobRow]:
    rows = []
    for job in view.jobs():
        weight, rate, total, capped = view.job_policy(job)
        tokens = {stage: view.job_total(job, f"{stage}_tokens") for stage in JOB_STAGES}
        rows.append(
            JobRow(
                job,
                weight,
                rate if rate >= 0 else None,
                total if total >= 0 else None,
                capped,
                tokens,
                padding_waste(tokens["routed"], tokens["padded"]),
            )
        )
    return rows


def _processor_rows(
    view: StatusView, live_by_name: dict[str, LedgerSnapshotRecord], partitions: int
) -> tuple[list[ProcessorRow], list[str]]:
    """A row per instance not retired (sorted), and the retired ones' names. A stale instance holds
    only the partitions it claimed that no live instance holds: each partition is counted once."""
    live = live_by_name.values()
    unowned = max(0, partitions - sum(cp.counters.get("owned_partitions", 0) for cp in live))
    processors, retired = [], []
    for name, cp in sorted(view.checkpoints.items()):
        if view.retired(name):
            retired.append(name)
            continue
        age = max(0.0, (view.read_ms - cp.taken_ms) / 1000)
        owned = cp.counters.get("owned_partitions", 0)
        held = owned
        if name not in live_by_name:  # what it claimed and nobody live holds: each counted once
            held = min(owned, unowned)
            unowned -= held
        processors.append(
            ProcessorRow(
                name,
                "live" if name in live_by_name else "stale",
                age,
                held,
                cp.counters.get("ingest_partitions", 0),
                owned - held,
            )
        )
    return processors, retired


def _ingest(
    view: StatusView, live: list[LedgerSnapshotRecord], processors: list[ProcessorRow], partitions: int
) -> IngestState:
    """Stalled while a partition has no live owner (all of them when no instance is live)."""
    stalled = sum(p.owned_partitions for p in processors if p.state == "stale")
    if not live or stalled:
        state: Literal["flowing", "paused", "stalled"] = "stalled"
    elif any(cp.counters.get("ingest_paused", 0) for cp in live):
        state = "paused"
    else:
        state = "flowing"
    return IngestState(
        state, view.ingest_lag, view.ingest_end, partitions if not live else stalled, partitions
    )


def report(view: StatusView, topics: TopicNames, stale_s: float = DEFAULT_STALE_S) -> StatusReport:
    """Judge ``view``: stale instances and consumers, what nobody can take, the ratios."""
    t = view.total
    live_by_name = live_instances(view, stale_s)
    live = list(live_by_name.values())
    partitions = max((cp.counters.get("ingest_partitions", 0) for cp in view.checkpoints.values()), default=0)
    processors, retired = _processor_rows(view, live_by_name, partitions)
    consumers = [consumer_row(view, n, c, stale_s) for n, c in sorted(view.contracts.items())]
    ledger = {
        stage: Tally(view.held(f"{stage}_items"), view.held(f"{stage}_tokens"))
        if stage in ("queued", "in_flight")
        else Tally(t(f"{stage}_items"), t(f"{stage}_tokens"))
        for stage in STAGES
    }
    padded = sum(view.consumer_total(c, "padded_tokens") for c in view.contracts)
    real = sum(view.consumer_total(c, "routed_tokens") for c in view.contracts)
    in_use = sum(cp.counters.get("lanes_in_use", 0) for cp in live)
    capacity = sum(cp.counters.get("shapes", 0) * cp.counters.get("lane_budget", 0) for cp in live)
    return StatusReport(
        taken_ms=view.read_ms,
        prefix=topics.prefix,
        stale_after_s=stale_s,
        ledger=ledger,
        dead_lettered_items=t("dead_lettered_items"),
        ingest=_ingest(view, live, processors, partitions),
        lanes=LaneFigures(in_use, ratio(in_use, capacity), sum(r.shape_switches for r in consumers)),
        padding_waste=padding_waste(real, padded),
        cache_hit_rate=ratio(
            sum(view.consumer_total(c, "cache_hits") for c in view.contracts),
            sum(view.consumer_total(c, "cache_lookups") for c in view.contracts),
        ),
        prompts=PromptFigures.of(view, t),
        processors=processors,
        retired_processors=retired,
        consumers=consumers,
        unserved=_unserved(view, consumers),
        jobs=_jobs(view),
    )


def with_rates(current: StatusReport, previous: StatusReport | None) -> StatusReport:
    """``current`` with the token rates since ``previous`` and the backlog's ETA (``--watch``)."""
    if previous is None or current.taken_ms <= previous.taken_ms:
        return current
    seconds = (current.taken_ms - previous.taken_ms) / 1000
    received = (current.ledger["received"].tokens - previous.ledger["received"].tokens) / seconds
    completed = (current.ledger["completed"].tokens - previous.ledger["completed"].tokens) / seconds
    backlog = current.ledger["queued"].tokens + current.ledger["in_flight"].tokens
    eta = backlog / completed if completed > 0 else (0.0 if backlog == 0 else None)
    rates = Rates(seconds, max(0.0, received), max(0.0, completed), backlog, eta)
    return replace(current, rates=rates)
