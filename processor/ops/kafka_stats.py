"""librdkafka's own statistics, the few that matter, as Prometheus gauges.

librdkafka emits a JSON document per client every ``statistics.interval.ms`` (from the thread that
polls the client, so on the owner thread for the processor). :meth:`KafkaStats.attach` adds the
interval and the ``stats_cb`` to a client config; the callback keeps, per client, only the figures
below and drops the document, so a scrape reads a few small tuples. Parsing costs about a
millisecond per client per interval (15 s by default); an operator may change the interval in the
properties file, and ``statistics.interval.ms=0`` turns the statistics off.

Kept (each labelled ``client``, librdkafka's client name such as ``rdkafka#consumer-1``):

- consumer lag per assigned partition: messages between what the client has consumed and the
  partition's end (``consumer_lag_stored``: the position, since tokenfabric commits offsets in
  transactions the consumer's own ``consumer_lag`` never sees; that one when no offset is stored);
  librdkafka's -1, "not known yet", is left out, and so is every partition the client no longer
  fetches (``fetch_state`` ``none``, ``stopping`` or ``stopped``: given up in a rebalance; librdkafka
  keeps reporting its last lag for as long as the client lives);
- per fetched partition, the client's position (``app_offset``) and the last stable offset
  (``ls_offset``), from which the consumer app counts the batches it has not read
  (processor.ops.consumer_metrics);
- request round-trip time per broker (average and p99 over the interval, in seconds; a consumer's
  fetch requests wait up to ``fetch.wait.max.ms`` at the broker, and that counts);
- queue depths: messages waiting in the producer queue, events waiting for the application to poll,
  requests waiting to be sent or waiting for their answer, and messages fetched but not consumed.

Field reference: librdkafka's STATISTICS.md.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("tokenfabric.metrics")

#: How often each client reports, unless the client config says otherwise.
STATS_INTERVAL_MS = 15_000

#: Queue name -> what it holds (the ``queue`` label of ``tokenfabric_kafka_queue_depth``).
QUEUES = {
    "producer": "messages waiting in the producer queue (msg_cnt)",
    "events": "events waiting for the application to poll (replyq)",
    "outbuf": "requests waiting to be sent, all brokers (outbuf_cnt)",
    "waitresp": "requests sent and waiting for their answer, all brokers (waitresp_cnt)",
    "fetch": "messages fetched and not consumed yet, all partitions (fetchq_cnt)",
}


#: ``fetch_state`` values of a partition the client does not fetch: not assigned (any more).
NOT_FETCHED = frozenset({"none", "stopping", "stopped"})


@dataclass(frozen=True, slots=True)
class Position:
    """Where a consumer stands in one partition it fetches: its position and the last stable offset."""

    topic: str
    partition: int
    position: int
    stable_end: int


@dataclass(frozen=True, slots=True)
class ClientStats:
    """The figures kept from one statistics document."""

    client: str
    kind: str
    lag: tuple[tuple[str, str, int], ...] = ()
    """(topic, partition, messages)"""
    rtt: tuple[tuple[str, float, float], ...] = ()
    """(broker, average seconds, p99 seconds)"""
    queues: Mapping[str, int] = field(default_factory=dict)
    positions: tuple[Position, ...] = ()
    """Partitions with a known position and end (both >= 0)."""


def parse_stats(document: str) -> ClientStats:
    """The kept figures of one librdkafka statistics JSON document; raises ValueError on a bad one."""
    doc: dict[str, Any] = json.loads(document)
    if not isinstance(doc, dict) or "name" not in doc:
        raise ValueError("not a librdkafka statistics document (no 'name')")
    lag: list[tuple[str, str, int]] = []
    positions: list[Position] = []
    fetch = 0
    for topic, t in (doc.get("topics") or {}).items():
        for partition, p in (t.get("partitions") or {}).items():
            if partition == "-1":  # the unassigned-messages pseudo partition
                continue
            fetch += int(p.get("fetchq_cnt", 0))
            if p.get("fetch_state") in NOT_FETCHED:
                continue
            at, end = int(p.get("app_offset", -1)), int(p.get("ls_offset", -1))
            if at >= 0 and end >= 0:
                positions.append(Position(topic, int(partition), at, end))
            messages = int(p.get("consumer_lag_stored", -1))
            if messages < 0:  # no offset stored (enable.auto.offset.store=false): the committed one
                messages = int(p.get("consumer_lag", -1))
            if messages >= 0:
                lag.append((topic, partition, messages))
    rtt: list[tuple[str, float, float]] = []
    outbuf = waitresp = 0
    for name, b in (doc.get("brokers") or {}).items():
        outbuf += int(b.get("outbuf_cnt", 0))
        waitresp += int(b.get("waitresp_cnt", 0))
        window = b.get("rtt") or {}
        if int(b.get("nodeid", -1)) >= 0 and int(window.get("cnt", 0)) > 0:
            rtt.append((name, window["avg"] / 1e6, window["p99"] / 1e6))
    queues = {
        "producer": int(doc.get("msg_cnt", 0)),
        "events": int(doc.get("replyq", 0)),
        "outbuf": outbuf,
        "waitresp": waitresp,
        "fetch": fetch,
    }
    return ClientStats(
        str(doc["name"]), str(doc.get("type", "")), tuple(lag), tuple(rtt), queues, tuple(positions)
    )


class KafkaStats(Collector):
    """The latest :class:`ClientStats` of every client whose config went through :meth:`attach`.

    ``labels``: constant labels on every series (the consumer app adds ``consumer``).
    """

    def __init__(self, interval_ms: int = STATS_INTERVAL_MS, labels: Mapping[str, str] | None = None) -> None:
        if interval_ms < 1:
            raise ValueError(f"statistics interval must be >= 1 ms, got {interval_ms}")
        self.interval_ms = interval_ms
        self.const = dict(labels or {})
        self.clients: dict[str, ClientStats] = {}
        self._seen: dict[str, float] = {}  # client -> monotonic time of its last document
        self._lock = threading.Lock()
        self._bad = 0

    def attach(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        """``conf`` with this collector's ``stats_cb`` and, unless ``conf`` sets one, its interval.

        An interval the operator set that is longer than this collector's becomes its own, so that a
        client is not forgotten between two of its documents.
        """
        try:
            theirs = int(conf.get("statistics.interval.ms", 0))
        except ValueError:
            theirs = 0  # librdkafka refuses it when the client is built, with its own message
        self.interval_ms = max(self.interval_ms, theirs)
        return {"statistics.interval.ms": str(self.interval_ms), **conf, "stats_cb": self.on_stats}

    def on_stats(self, document: str) -> None:
        try:
            stats = parse_stats(document)
        except (ValueError, TypeError, KeyError) as exc:
            self._bad += 1
            if self._bad == 1:  # once: a librdkafka that changed its format would repeat it forever
                log.warning("librdkafka statistics not understood (%s); later ones are dropped quietly", exc)
            return
        with self._lock:
            self.clients[stats.client] = stats
            self._seen[stats.client] = time.monotonic()

    def _forget_quiet(self) -> None:
        """Drop clients silent for three intervals: closed ones (a restore's reader, say) would
        otherwise report their last lag forever."""
        cutoff = time.monotonic() - 3 * self.interval_ms / 1000
        for client in [c for c, at in self._seen.items() if at < cutoff]:
            del self.clients[client], self._seen[client]

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._forget_quiet()
            clients = sorted(self.clients.values(), key=lambda c: c.client)
        keys = list(self.const)
        values = list(self.const.values())
        lag = GaugeMetricFamily(
            "tokenfabric_kafka_consumer_lag_messages",
            "librdkafka consumer lag: messages between the client's position and the partition's end.",
            labels=[*keys, "client", "topic", "partition"],
        )
        rtt = GaugeMetricFamily(
            "tokenfabric_kafka_broker_rtt_seconds",
            "librdkafka request round-trip time to each broker over the last statistics interval.",
            labels=[*keys, "client", "broker", "stat"],
        )
        depth = GaugeMetricFamily(
            "tokenfabric_kafka_queue_depth",
            "librdkafka queue depths: " + "; ".join(f"{q}: {doc}" for q, doc in QUEUES.items()) + ".",
            labels=[*keys, "client", "queue"],
        )
        for c in clients:
            for topic, partition, messages in c.lag:
                lag.add_metric([*values, c.client, topic, partition], messages)
            for broker, avg, p99 in c.rtt:
                rtt.add_metric([*values, c.client, broker, "avg"], avg)
                rtt.add_metric([*values, c.client, broker, "p99"], p99)
            for queue, n in c.queues.items():
                depth.add_metric([*values, c.client, queue], n)
        yield from (lag, rtt, depth)
