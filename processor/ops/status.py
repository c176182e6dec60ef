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
module, ``status.schema.json``; docs/operations.md describes it).

Retiring an instance or a consumer that is gone for good writes to the topics: processor.ops.retire.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import KafkaException, TopicPartition

from processor.core.accounting import cached_prompt_share
from processor.core.contract import Contract
from processor.core.ledger_keys import Scope, consumer_key, job_key, model_key, parse_key, stage_unit
from processor.core.measures import budget_fill, padding_waste
from processor.kafka.factory import KAFKA
from processor.kafka.reader import passing, read_topic, watermarks
from processor.kafka.topics import TopicNames
from processor.ops.contracts import read_announcements
from processor.wire.control import decode_ledger_snapshot
from processor.wire.records import LedgerSnapshotRecord

DEFAULT_STALE_S = 30.0
"""A processor checkpoint, or a consumer's last sign of life, older than this is STALE."""
SCHEMA_PATH = Path(__file__).with_name("status.schema.json")
SCHEMA_ID = "tokenfabric-status/1"
RETIRED = "retired_ms"
"""Counter set on a checkpoint rewritten by :func:`forget_processor`: the wall-clock time it was."""
_STAGE_NAMES = "received queued routed in_flight completed failed cancelled expired retried"
STAGES = tuple(_STAGE_NAMES.split())
"""The ledger's stages status shows: ``received = queued + routed + cancelled + expired`` and
``routed = in_flight + completed + failed`` (plus the adopted and released terms of a handover, and
``retried`` on both sides: items sent back to the lanes after a retriable failure)."""


@dataclass(slots=True)
class GroupFacts:
    """A consumer's group on its batch topic, as the broker reports it (None: not known)."""

    members: int | None = None
    committed: int | None = None
    end: int | None = None
    unread: int | None = None


@dataclass(slots=True)
class StatusView:
    contracts: dict[str, Contract] = field(default_factory=dict)
    checkpoints: dict[str, LedgerSnapshotRecord] = field(default_factory=dict)
    ingest_lag: int | None = None
    ingest_end: int = 0
    announced_ms: dict[str, int] = field(default_factory=dict)
    """When each contract was written (its message timestamp)."""
    groups: dict[str, GroupFacts] = field(default_factory=dict)
    read_ms: int = 0
    """Wall-clock time of the read; ages are measured from it."""

    def total(self, key: str) -> int:
        return sum(cp.counters.get(key, 0) for cp in self.checkpoints.values())

    def held(self, key: str) -> int:
        """``queued_*`` or ``in_flight_*`` summed over instances, less what was counted twice: state a
        crashed instance's last checkpoint still claims and another instance has adopted since
        (processor/core/accounting.py). A per-model key (``queued_items@m``) works the same."""
        parsed = parse_key(key)
        split = stage_unit(parsed.counter)
        if split is None:
            raise ValueError(f"held({key!r}): not a stage's items or tokens")
        stage, unit = split
        adopted, released = (parsed.renamed(f"{way}_{stage}_{unit}") for way in ("adopted", "released"))
        return self.total(key) - (self.total(adopted.encode()) - self.total(released.encode()))

    def consumer_total(self, consumer: str, key: str) -> int:
        return self.total(consumer_key(key, consumer))

    def retired(self, instance: str) -> bool:
        return self.checkpoints[instance].counters.get(RETIRED, 0) > 0

    def owners(self, scope: Scope, counter: str | None = None) -> list[str]:
        """The models, consumers or jobs (``scope``) some checkpoint has a key for (``counter``'s
        only, when given), sorted."""
        keys = (parse_key(key) for cp in self.checkpoints.values() for key in cp.counters)
        return sorted({k.owner for k in keys if k.scope == scope and counter in (None, k.counter)})

    def jobs(self) -> list[str]:
        """Every job a checkpoint counts (its ledger book, or its share: docs/shares.md)."""
        return self.owners("job")

    def job_total(self, job: str, key: str) -> int:
        """A job's counter (``routed_tokens``, ``padded_tokens``...) summed over instances."""
        return self.total(job_key(key, job))

    def job_policy(self, job: str) -> tuple[float, int, int, bool]:
        """(weight, tokens/s cap, total cap, capped now) as the newest checkpoint has them; -1: no cap."""
        newest = max(self.checkpoints.values(), key=lambda cp: cp.taken_ms, default=None)
        c = newest.counters if newest is not None else {}
        weight = c.get(job_key("weight_milli", job), 1000) / 1000
        capped = any(cp.counters.get(job_key("capped", job), 0) for cp in self.checkpoints.values())
        rate, total = c.get(job_key("max_tokens_per_s", job), -1), c.get(job_key("max_tokens", job), -1)
        return weight, rate, total, capped


def ingest_lag(
    conf: Mapping[str, str], topic: str, group: str, timeout_s: float = 10.0
) -> tuple[int | None, int]:
    """(messages the group has not committed past, messages ever written) on ``topic``."""
    consumer = KAFKA.consumer({**conf, "group.id": group, "enable.auto.commit": "false"})
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return None, 0
        tps = [TopicPartition(topic, p) for p in meta.partitions]
        try:
            committed: list[TopicPartition] | None = consumer.committed(tps, timeout=timeout_s)
        except KafkaException as exc:
            if not passing(exc):
                raise
            committed = None  # coordinator moving, or offsets held by an open transaction: unknown for now
        lag = end = 0
        for tp in committed if committed is not None else tps:
            low, high = watermarks(consumer, TopicPartition(topic, tp.partition), timeout_s)
            end += high
            lag += high - (tp.offset if tp.offset >= 0 else low)
        return (lag if committed is not None else None), end
    finally:
        consumer.close()


def consumer_groups(
    conf: Mapping[str, str], topics: TopicNames, consumers: list[str], timeout_s: float = 10.0
) -> dict[str, GroupFacts]:
    """Members, committed offset and unread batches of each consumer's group on its batch topic.

    What the broker will not say (no rights to describe a group, a topic not created yet) stays None.
    """
    from confluent_kafka import ConsumerGroupTopicPartitions

    out = {c: GroupFacts() for c in consumers}
    if not consumers:
        return out
    admin = KAFKA.admin(dict(conf))
    groups = {topics.consumer_group(c): c for c in consumers}
    for group, future in admin.describe_consumer_groups(list(groups), request_timeout=timeout_s).items():
        # on an error (no right to describe it) members stay unknown: judged by the last completion alone
        with contextlib.suppress(KafkaException):
            out[groups[group]].members = len(future.result(timeout=timeout_s).members)
    offsets = {
        c: admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(topics.consumer_group(c), [TopicPartition(topics.batches(c), 0)])],
            request_timeout=timeout_s,
        )[topics.consumer_group(c)]
        for c in consumers
    }
    probe = KAFKA.consumer({**conf, "group.id": f"{topics.prefix}-status", "enable.auto.commit": "false"})
    try:
        for c, future in offsets.items():
            facts = out[c]
            try:
                tps = future.result(timeout=timeout_s).topic_partitions
                low, high = watermarks(probe, TopicPartition(topics.batches(c), 0), timeout_s)
            except KafkaException:
                continue
            facts.end = high
            committed = tps[0].offset if tps and tps[0].error is None else -1
            facts.committed = committed if committed >= 0 else None
            start = max(low, committed)
            facts.unread = (
                0 if start >= high else sum(1 for _ in read_topic(conf, topics.batches(c), starts={0: start}))
            )
    finally:
        probe.close()
    return out


def gather(conf: Mapping[str, str], topics: TopicNames, group: str = "", groups: bool = False) -> StatusView:
    """Contracts, every instance's latest checkpoint, ingest lag; with ``groups``, each consumer's
    group too (its members and lag: one more request per consumer)."""
    view = StatusView()
    for name, announced in read_announcements(conf, topics).items():
        view.contracts[name] = announced.contract
        view.announced_ms[name] = announced.timestamp_ms
    # Compacted: the whole topic is the latest checkpoint per instance plus the last minute or so of
    # uncompacted ones; an instance dead for long is still found, wherever its checkpoint sits.
    for msg in read_topic(conf, topics.accounting):
        if msg.value() is None:
            view.checkpoints.pop((msg.key() or b"").decode("utf-8", "replace"), None)
            continue
        cp = decode_ledger_snapshot(msg.value())
        previous = view.checkpoints.get(cp.instance)
        if previous is None or (cp.taken_ms, cp.sequence) >= (previous.taken_ms, previous.sequence):
            view.checkpoints[cp.instance] = cp
    view.ingest_lag, view.ingest_end = ingest_lag(conf, topics.ingest, group or topics.processor_group)
    if groups:
        view.groups = consumer_groups(conf, topics, sorted(view.contracts))
    view.read_ms = int(time.time() * 1000)
    return view


# -- the report -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tally:
    items: int
    tokens: int


@dataclass(frozen=True, slots=True)
class ProcessorRow:
    instance: str
    state: Literal["live", "stale"]
    checkpoint_age_s: float
    owned_partitions: int
    """A live instance's partitions; a stale one's only those no live instance holds since (each
    partition counted once: the rest were handed over)."""
    ingest_partitions: int
    handed_over: int = 0
    """A stale instance's partitions that live instances hold now."""


@dataclass(frozen=True, slots=True)
class ContractTerms:
    batching: str
    budget_tokens: int
    max_items: int
    pad_multiple: int
    max_inflight: int


@dataclass(frozen=True, slots=True)
class ConsumerRow:
    consumer: str
    model: str
    state: Literal["up", "silent", "down", "stale"]
    """up: its group has a member, answering; silent: a member, but batches wait for it and it has
    answered nothing for ``stale_s`` (hung, or a crashed process still in its group until its session
    times out); down: no member, a sign of life within ``stale_s``; stale: none for longer."""
    members: int | None
    last_seen_age_s: float | None
    last_completion_age_s: float | None
    announced_age_s: float | None
    contract: ContractTerms
    in_flight_batches: int
    unread_batches: int | None
    slots: dict[str, int]
    routed_tokens: int
    completed_tokens: int
    batches: int
    oversized_batches: int
    padding_waste: float | None
    budget_fill: float | None
    cache_hit_rate: float | None
    shape_switches: int
    prompts: PromptFigures


@dataclass(frozen=True, slots=True)
class PromptFigures:
    """How completed prompts were served: from the engine's prefix cache, or computed (prefill).

    ``cached_tokens + prefill_tokens`` is the completed prompt tokens (the ledger's ``PROMPTS``
    equation); ``cached_share`` is ``cached_tokens`` over that, None while nothing completed.
    ``counted`` is False when some checkpoint has no prompt counters (a processor of an earlier
    version, or one whose scheduler is given no cached counts): the figures are then zeros, not a
    measurement."""

    counted: bool
    cached_tokens: int
    prefill_tokens: int
    cached_share: float | None

    @classmethod
    def of(cls, view: StatusView, total: Callable[[str], int]) -> PromptFigures:
        """The figures ``total`` (a sum over checkpoints of one scope) gives, if ``view`` counts them."""
        counted = bool(view.checkpoints) and all(
            "prefill_tokens" in cp.counters for cp in view.checkpoints.values()
        )
        if not counted:
            return cls(False, 0, 0, None)
        cached, prefill = total("cached_prompt_tokens"), total("prefill_tokens")
        return cls(True, cached, prefill, cached_prompt_share(cached, prefill))


@dataclass(frozen=True, slots=True)
class UnservedModel:
    model: str
    """The serving key the items wait under: the model, or ``model@adapter`` for the items of a LoRA
    adapter no live consumer serves (a consumer of the base model, or of another adapter, does not)."""
    items: int
    tokens: int
    consumers: list[str]
    """Consumers with a contract for the model, none of them up (empty: no contract at all)."""


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job's token share (docs/shares.md) and its tokens at each stage, summed over instances."""

    job: str
    """"" for items that name no job."""
    weight: float
    max_tokens_per_s: int | None
    max_tokens: int | None
    capped: bool
    """A quota holds the job's items back now, on some instance."""
    tokens: dict[str, int]
    """received, queued, routed, completed, failed, padded, cached_prompt, prefill."""
    padding_waste: float | None


@dataclass(frozen=True, slots=True)
class Rates:
    interval_s: float
    received_tokens_per_s: float
    completed_tokens_per_s: float
    backlog_tokens: int
    eta_s: float | None
    """Backlog over the completed rate; None while nothing completes."""


@dataclass(frozen=True, slots=True)
class IngestState:
    state: Literal["flowing", "paused", "stalled"]
    """stalled: some ingest partitions have no live owner (all of them when no processor is live)."""
    uncommitted_messages: int | None
    messages: int
    stalled_partitions: int = 0
    """Ingest partitions whose last owner is STALE and that no live instance holds yet."""
    partitions: int = 0
    """The ingest topic's partitions, as the checkpoints count them (0: none checkpointed)."""


@dataclass(frozen=True, slots=True)
class LaneFigures:
    in_use: int
    pressure: float | None
    shape_switches: int


@dataclass(frozen=True, slots=True)
class StatusReport:
    """One status, for text and JSON alike; ratios are fractions (0.5 is 50%), ages seconds."""

    taken_ms: int
    prefix: str
    stale_after_s: float
    ledger: dict[str, Tally]
    dead_lettered_items: int
    ingest: IngestState
    lanes: LaneFigures
    padding_waste: float | None
    cache_hit_rate: float | None
    prompts: PromptFigures
    processors: list[ProcessorRow]
    retired_processors: list[str]
    consumers: list[ConsumerRow]
    unserved: list[UnservedModel]
    jobs: list[JobRow] = field(default_factory=list)
    rates: Rates | None = None

    @property
    def time(self) -> str:
        return datetime.fromtimestamp(self.taken_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    def as_json(self) -> dict[str, Any]:
        """The documented object (``status.schema.json``)."""
        return {"schema": SCHEMA_ID, "time": self.time, **asdict(self)}


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


def report(view: StatusView, topics: TopicNames, stale_s: float = DEFAULT_STALE_S) -> StatusReport:
    """Judge ``view``: stale instances and consumers, what nobody can take, the ratios."""
    t = view.total
    now = view.read_ms
    live_by_name = live_instances(view, stale_s)
    live = list(live_by_name.values())
    partitions = max((cp.counters.get("ingest_partitions", 0) for cp in view.checkpoints.values()), default=0)
    unowned = max(0, partitions - sum(cp.counters.get("owned_partitions", 0) for cp in live))
    processors, retired = [], []
    for name, cp in sorted(view.checkpoints.items()):
        if view.retired(name):
            retired.append(name)
            continue
        age = max(0.0, (now - cp.taken_ms) / 1000)
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
    stalled = sum(p.owned_partitions for p in processors if p.state == "stale")
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
    if not live or stalled:
        ingest_state: Literal["flowing", "paused", "stalled"] = "stalled"
    elif any(cp.counters.get("ingest_paused", 0) for cp in live):
        ingest_state = "paused"
    else:
        ingest_state = "flowing"
    return StatusReport(
        taken_ms=now,
        prefix=topics.prefix,
        stale_after_s=stale_s,
        ledger=ledger,
        dead_lettered_items=t("dead_lettered_items"),
        ingest=IngestState(
            ingest_state,
            view.ingest_lag,
            view.ingest_end,
            partitions if not live else stalled,
            partitions,
        ),
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
