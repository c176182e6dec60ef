"""A stand-in for the processor service around a real scheduling core, and exposition text read back
through prometheus_client's own parser: what the metrics and health tests share."""

from __future__ import annotations

import gzip
import time
import urllib.request
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from processor.apps.observe import ServiceCounters, ServiceObserver, ServiceStatus
from processor.apps.settings import ProcessorSettings
from processor.core.accounting import Ledger
from processor.core.scheduler import Scheduler
from processor.kafka.factory import ClientFactory, ConsumerClient
from processor.kafka.memory import MemoryKafka
from processor.kafka.topics import TopicNames, topic_specs

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
    registry_down_since_s: float | None = None
    observer: ServiceObserver = field(default_factory=ServiceObserver)
    clock_ms: int = 0
    owned: frozenset[int] = frozenset({0, 1})
    kafka: MemoryKafka = field(default_factory=MemoryKafka)
    """The pipeline's topics, for the pipeline view (processor.ops.pipeline_view); empty unless a test
    writes to them."""
    topics: TopicNames = field(default_factory=lambda: TopicNames("fake"))
    settings: ProcessorSettings = field(default_factory=lambda: ProcessorSettings(group_id="fake-proc"))
    conf: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kafka.create_topics(topic_specs(self.topics, ingest_partitions=3))
        self.clients: ClientFactory = self.kafka.clients()
        self.ingest: ConsumerClient = self.clients.consumer({"group.id": self.settings.group_id})

    def now_ms(self) -> int:
        return self.clock_ms

    @property
    def status(self) -> ServiceStatus:
        """As the service takes it at the end of each step, from ``owned`` and ``lag`` now."""
        return ServiceStatus.of(self.owned, self.lag)


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


#: What Prometheus sends when it prefers OpenMetrics.
OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"


@dataclass(frozen=True, slots=True)
class Scrape:
    content_type: str
    encoding: str | None
    text: str


def scrape(url: str, accept: str | None = None, gzipped: bool = False, timeout_s: float = 10.0) -> Scrape:
    """GET ``url`` (a ``/metrics``) the way a scraper does: its Accept and Accept-Encoding headers."""
    headers = {"Accept": accept} if accept else {}
    if gzipped:
        headers["Accept-Encoding"] = "gzip"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as resp:
        body, encoding = resp.read(), resp.headers.get("Content-Encoding")
        content_type = resp.headers.get("Content-Type", "")
    return Scrape(content_type, encoding, (gzip.decompress(body) if encoding == "gzip" else body).decode())


def parse_openmetrics(text: str) -> Samples:
    """Samples of an OpenMetrics exposition, through prometheus_client's strict OpenMetrics parser."""
    out: Samples = {}
    for family in openmetrics_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out
