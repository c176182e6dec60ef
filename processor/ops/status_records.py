"""The typed records of one status (:class:`StatusReport` and its rows): what the CLI prints as text
and ``--json`` prints by :meth:`StatusReport.as_json`, documented by ``status.schema.json``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from processor.core.accounting import cached_prompt_share
from processor.ops.status_view import StatusView

SCHEMA_PATH = Path(__file__).with_name("status.schema.json")
SCHEMA_ID = "tokenfabric-status/1"


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
