"""A stand-in for the processor service around a real scheduling core, and exposition text read back
through prometheus_client's own parser: what the metrics and health tests share."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from processor.apps.observe import ServiceCounters, ServiceObserver
from processor.core.accounting import Ledger
from processor.core.scheduler import Scheduler

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# -- helpers ------------------------------------------------------------------------------------


@dataclass
class FakeService:
    """The attributes processor.ops.metrics and processor.ops.health read, around a real Scheduler."""

    core: Scheduler = field(default_factory=lambda: Scheduler(ledger=Ledger()))
    counters: ServiceCounters = field(default_factory=ServiceCounters)
    lag: dict[int, int] = field(default_factory=dict)
    last_step_s: float = field(default_factory=time.monotonic)
    last_broker_ok_s: float = field(default_factory=time.monotonic)
    ledger_error: str | None = None
    restoring_since_s: float | None = None
    observer: ServiceObserver = field(default_factory=ServiceObserver)
    clock_ms: int = 0

    def now_ms(self) -> int:
        return self.clock_ms


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} not exposed; have {sorted(n for n, _ in samples if name in n)}"
    return samples[key]


def read_registry(registry: CollectorRegistry) -> Samples:
    return parse(generate_latest(registry).decode())
