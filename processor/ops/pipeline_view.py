"""The whole pipeline as ``tokenfabric status`` reads it, exported by every live processor.

Why: a figure a processor reports about itself vanishes with it. When an instance dies, the sum of its
ledger gauges drops by its share, its unserved items disappear (and an alert's ``for:`` clock with
them), and its ingest partitions report no lag at all, although Kafka and ``status`` still count all
of it. So every processor also reads what ``status`` reads, from Kafka, and exports it:

* the contracts and every instance's latest ledger checkpoint (``accounting``, compacted), tailed
  with one consumer kept open: a refresh reads only what was appended since the last one;
* the processor group's committed offset and the end of every ingest partition: the lag as the
  group sees it, partitions no live instance owns included.

The pipeline ledger, the processors' rows and the unserved models come from
:func:`processor.ops.status.report` itself, so ``/metrics`` and ``status`` cannot disagree on a
formula. Every live instance exports the same figures: aggregate them with ``max``, never ``sum``
(docs/metrics.md, "The pipeline, as status reads it").

Reads happen on a thread of their own, once per ``refresh_s`` while the process is scraped, through
the service's client factory, never on the owner thread nor in a scrape. A broker that does not
answer keeps the previous view: ``tokenfabric_pipeline_read_age_seconds`` says how old it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from processor.core.ledger_keys import model_key
from processor.kafka.factory import KAFKA, ClientFactory, ConsumerClient
from processor.kafka.reader import partitions_of
from processor.kafka.topics import TopicNames
from processor.ops.status import DEFAULT_STALE_S, STAGES, StatusReport, StatusView, report
from processor.wire.control import decode_contract, decode_ledger_snapshot
from processor.wire.errors import DecodeError

log = logging.getLogger("tokenfabric.metrics")

#: A scrape re-reads Kafka only when the view it has is older than this.
REFRESH_S = 1.0
#: The longest one refresh spends reading the contracts and accounting topics.
READ_BUDGET_S = 1.0
#: Timeout of each broker request of a refresh (committed offsets, watermarks, metadata).
REQUEST_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class GroupLag:
    """Per ingest partition: the processor group's committed offset and the partition's end."""

    committed: dict[int, int] = field(default_factory=dict)
    """-1: the group has committed nothing there (the lag counts from the partition's start)."""
    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)

    def messages(self, partition: int) -> int:
        """Offsets between what the group committed past and the end (``status``'s ingest lag per
        partition). Offsets, not records: a transactional producer's commit markers take one each;
        tokenfabric's producers are idempotent, not transactional, so ingest holds none."""
        committed = self.committed.get(partition, -1)
        base = committed if committed >= 0 else self.start.get(partition, 0)
        return max(0, self.end.get(partition, 0) - base)


class PipelineReader:
    """Contracts, checkpoints and the group's ingest offsets, read incrementally from Kafka.

    Not thread-safe: :class:`PipelineCollector` calls it under its lock. ``group`` is the processors'
    consumer group; the reader never joins it and never commits (``enable.auto.commit`` off), it only
    asks for its committed offsets.
    """

    def __init__(
        self,
        conf: Mapping[str, str],
        topics: TopicNames,
        group: str,
        clients: ClientFactory = KAFKA,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.conf = dict(conf)
        self.topics = topics
        self.group = group
        self.clients = clients
        self.timeout_s = timeout_s
        self.view = StatusView()
        self.lag = GroupLag()
        self._consumer: ConsumerClient | None = None
        self._assigned: set[tuple[str, int]] = set()
        self._at_end: set[tuple[str, int]] = set()  # partitions that reported their end once

    @property
    def caught_up(self) -> bool:
        """Every contracts and accounting partition was read to its end once: until then the view
        may lack instances, and its figures are not published."""
        return bool(self._assigned) and self._at_end >= self._assigned

    def refresh(self, wall_ms: int) -> None:
        """Read what was appended since the last call, and the group's offsets; raises
        ``KafkaException`` when the broker does not answer (the previous figures stay)."""
        consumer = self._reader()
        self._tail(consumer)
        self.lag = self._group_lag(consumer)
        view = self.view
        view.ingest_lag = sum(self.lag.messages(p) for p in self.lag.end)
        view.ingest_end = sum(self.lag.end.values())
        view.read_ms = wall_ms

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _reader(self) -> ConsumerClient:
        if self._consumer is None:
            consumer = self.clients.consumer(
                {
                    **self.conf,
                    "group.id": self.group,
                    "enable.auto.commit": "false",
                    "isolation.level": "read_committed",
                    "enable.partition.eof": "true",
                    "fetch.wait.max.ms": "50",
                }
            )
            start = [
                TopicPartition(topic, p, OFFSET_BEGINNING)
                for topic in (self.topics.contracts, self.topics.accounting)
                for p in partitions_of(consumer, topic, self.timeout_s) or []
            ]
            consumer.assign(start)
            self._assigned = {(tp.topic, tp.partition) for tp in start}
            self._at_end = set()
            self._consumer = consumer
        return self._consumer

    def _tail(self, consumer: ConsumerClient) -> None:
        """Apply every contract and checkpoint appended since the last call, up to ``READ_BUDGET_S``:
        the first refresh of a long-lived accounting topic may take several scrapes."""
        deadline = time.monotonic() + READ_BUDGET_S
        while time.monotonic() < deadline:
            msgs = consumer.consume(num_messages=1000, timeout=0.05)
            if not msgs:
                return
            for msg in msgs:
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        self._at_end.add((msg.topic(), msg.partition()))
                        continue
                    raise KafkaException(error)
                self._apply(msg)

    def _apply(self, msg: object) -> None:
        """One contract or checkpoint, kept as ``processor.ops.status.gather`` keeps it."""
        view = self.view
        key = (msg.key() or b"").decode("utf-8", "replace")  # type: ignore[attr-defined]
        value = msg.value()  # type: ignore[attr-defined]
        try:
            if msg.topic() == self.topics.contracts:  # type: ignore[attr-defined]
                if value is None:
                    view.contracts.pop(key, None)
                    view.announced_ms.pop(key, None)
                else:
                    view.contracts[key] = decode_contract(value).contract
                    view.announced_ms[key] = msg.timestamp()[1]  # type: ignore[attr-defined]
                return
            if value is None:
                view.checkpoints.pop(key, None)
                return
            cp = decode_ledger_snapshot(value)
        except DecodeError as exc:
            log.warning("pipeline view: undecodable record on %s: %s", msg.topic(), exc)  # type: ignore[attr-defined]
            return
        previous = view.checkpoints.get(cp.instance)
        if previous is None or (cp.taken_ms, cp.sequence) >= (previous.taken_ms, previous.sequence):
            view.checkpoints[cp.instance] = cp

    def _group_lag(self, consumer: ConsumerClient) -> GroupLag:
        topic = self.topics.ingest
        partitions = partitions_of(consumer, topic, self.timeout_s) or []
        tps = [TopicPartition(topic, p) for p in partitions]
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=self.timeout_s)}
        start, end = {}, {}
        for tp in tps:
            start[tp.partition], end[tp.partition] = consumer.get_watermark_offsets(
                tp, timeout=self.timeout_s
            )
        return GroupLag(committed, start, end)


@dataclass(frozen=True, slots=True)
class PipelineFigures:
    """One refresh's view, judged: what the collector exports until the next one."""

    report: StatusReport
    lag: GroupLag
    unserved: dict[str, tuple[int, int]]
    """model -> (items, tokens) held waiting for a model no contract names."""
    shares: dict[str, dict[str, int]]
    """processor -> stage -> prompt tokens, as its last checkpoint counts them (retired left out)."""


def unserved_by_contract(view: StatusView) -> dict[str, tuple[int, int]]:
    """Items and tokens waiting, over every instance's last checkpoint, for a model that no announced
    contract names: the processor's own ``Scheduler.unserved`` rule, applied to the whole pipeline
    (a dead instance's waiting items included, adopted ones counted once: ``StatusView.held``)."""
    served = {c.model for c in view.contracts.values()}
    out = {}
    for model in view.owners("model", "queued_items"):
        items = view.held(model_key("queued_items", model))
        if model not in served and items > 0:
            out[model] = (items, view.held(model_key("queued_tokens", model)))
    return out


class PipelineCollector(Collector):
    """``tokenfabric_pipeline_*``: the pipeline as ``status`` reads it (see the module docstring).

    ``background`` (the default): a daemon thread refreshes the view every ``refresh_s`` for as long
    as scrapes keep coming (it stops after ``idle_stop_s`` without one, and the next scrape starts it
    again), so a scrape never waits for Kafka; the first scrape has no figures yet. Without it, each
    scrape refreshes first when the view is older than ``refresh_s`` (tests drive the in-memory
    Kafka, which is not thread-safe, that way).
    """

    def __init__(
        self,
        reader: PipelineReader,
        stale_s: float = DEFAULT_STALE_S,
        refresh_s: float = REFRESH_S,
        background: bool = True,
        idle_stop_s: float = 60.0,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self.stale_s = stale_s
        self.refresh_s = refresh_s
        self.background = background
        self.idle_stop_s = idle_stop_s
        self.wall_ms = wall_ms
        self.clock = clock
        self._lock = threading.Lock()
        self._figures: PipelineFigures | None = None
        self._read_s: float | None = None  # monotonic time of the last complete refresh
        self._tried_s: float | None = None
        self._scraped_s = clock()
        self._thread: threading.Thread | None = None
        self._failing = False

    def describe(self) -> Iterable[Metric]:
        return ()

    def refresh(self) -> None:
        """Read Kafka and judge the view now; a failure keeps the previous figures (and says so)."""
        with self._lock:
            self._tried_s = self.clock()
            try:
                self.reader.refresh(self.wall_ms())
            except (KafkaException, TimeoutError, RuntimeError) as exc:
                # once per run of failures: a broker outage fails every refresh (the ride says it)
                log.log(
                    logging.DEBUG if self._failing else logging.WARNING,
                    "pipeline view not refreshed (the last one stays): %s",
                    exc,
                )
                self._failing = True
                return
            self._failing = False
            view = self.reader.view
            if not self.reader.caught_up:
                return  # a first read of a long accounting topic takes several refreshes
            rep = report(view, self.reader.topics, self.stale_s)
            shares = {
                row.instance: {
                    stage: view.checkpoints[row.instance].counters.get(f"{stage}_tokens", 0)
                    for stage in STAGES
                }
                for row in rep.processors
            }
            self._figures = PipelineFigures(rep, self.reader.lag, unserved_by_contract(view), shares)
            self._read_s = self.clock()

    def figures(self) -> PipelineFigures | None:
        """The latest figures (refreshed first without a background thread); None before any read."""
        self._scraped_s = self.clock()
        if self.background:
            thread = self._thread
            if thread is None or not thread.is_alive():
                self._thread = threading.Thread(
                    target=self._refresh_while_scraped, name="pipeline-view", daemon=True
                )
                self._thread.start()
        elif self._tried_s is None or self.clock() - self._tried_s >= self.refresh_s:
            self.refresh()
        return self._figures

    def _refresh_while_scraped(self) -> None:
        try:
            while self.clock() - self._scraped_s < self.idle_stop_s:
                started = self.clock()
                self.refresh()
                time.sleep(max(0.0, self.refresh_s - (self.clock() - started)))
        finally:
            with self._lock:
                self.reader.close()

    def collect(self) -> Iterator[Metric]:
        figures = self.figures()
        age = GaugeMetricFamily(
            "tokenfabric_pipeline_read_age_seconds",
            "Seconds since this process last read the pipeline's view from Kafka (absent before the first).",
        )
        read_s = self._read_s
        if figures is None or read_s is None:
            yield age
            return
        age.add_metric([], max(0.0, self.clock() - read_s))
        yield age
        yield from _processors(figures.report)
        yield from _ledger(figures.report, figures.shares)
        yield from _ingest(figures.lag)
        yield from _unserved(figures.unserved)


def _processors(rep: StatusReport) -> Iterator[Metric]:
    checkpoint = GaugeMetricFamily(
        "tokenfabric_pipeline_checkpoint_age_seconds",
        "Seconds since each processor instance's last ledger checkpoint (retired ones left out). "
        "A live instance checkpoints with every commit; past the stale limit it is STALE.",
        labels=["processor"],
    )
    owned = GaugeMetricFamily(
        "tokenfabric_pipeline_owned_partitions",
        "Ingest partitions each processor instance holds: a live one's at its last checkpoint, a stale "
        "one's only those no live instance has taken over (each partition counted once, as status does).",
        labels=["processor"],
    )
    stale = GaugeMetricFamily(
        "tokenfabric_pipeline_processor_stale",
        "1 when the instance's last checkpoint is older than the stale limit (status's STALE), else 0.",
        labels=["processor"],
    )
    for row in rep.processors:
        checkpoint.add_metric([row.instance], row.checkpoint_age_s)
        owned.add_metric([row.instance], row.owned_partitions)
        stale.add_metric([row.instance], int(row.state == "stale"))
    yield from (checkpoint, owned, stale)


def _ledger(rep: StatusReport, shares: dict[str, dict[str, int]]) -> Iterator[Metric]:
    share = GaugeMetricFamily(
        "tokenfabric_pipeline_processor_tokens",
        "Prompt tokens at each ledger stage in each instance's last checkpoint: a dead instance's "
        "share stays. queued and in_flight as that instance last counted them (state another instance "
        "adopted since is counted by both: the pipeline's figure is tokenfabric_pipeline_tokens).",
        labels=["processor", "stage"],
    )
    for processor, stages in sorted(shares.items()):
        for stage, tokens in stages.items():
            share.add_metric([processor, stage], tokens)
    yield share
    for unit in ("items", "tokens"):
        fam = GaugeMetricFamily(
            f"tokenfabric_pipeline_{unit}",
            f"Prompt {unit} at each ledger stage over every instance's last checkpoint, as status "
            "shows them (queued and in_flight counted once when an instance adopted a dead one's).",
            labels=["stage"],
        )
        for stage in STAGES:
            fam.add_metric([stage], getattr(rep.ledger[stage], unit))
        yield fam


def _ingest(lag: GroupLag) -> Iterator[Metric]:
    messages = GaugeMetricFamily(
        "tokenfabric_pipeline_ingest_lag_messages",
        "Ingest offsets after the processor group's committed offset, per partition: the lag as the "
        "group (and Kafka's kafka-consumer-groups) sees it, owned or not.",
        labels=["partition"],
    )
    for partition in sorted(lag.end):
        messages.add_metric([str(partition)], lag.messages(partition))
    yield messages
    count = GaugeMetricFamily("tokenfabric_pipeline_ingest_partitions", "Partitions of the ingest topic.")
    if lag.end:
        count.add_metric([], len(lag.end))
    yield count


def _unserved(unserved: dict[str, tuple[int, int]]) -> Iterator[Metric]:
    items = GaugeMetricFamily(
        "tokenfabric_pipeline_unserved_items",
        "Items waiting, over every instance's last checkpoint, for a model no announced contract names.",
        labels=["model"],
    )
    for model, (n, _tokens) in sorted(unserved.items()):
        items.add_metric([model], n)
    yield items
