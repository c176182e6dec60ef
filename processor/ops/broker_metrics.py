"""Whether this process reaches the broker, for Prometheus: the series TokenfabricBrokerUnreachable
reads (processor.ops.alerts).

Why its own series rather than ``up``: a processor or consumer riding out an outage
(processor.apps.ride) stays up and scraped, so ``up`` says nothing; before issue 36 the only sign of
a broker gone was every target going down ~70 s later, as the processes exited.

- ``tokenfabric_broker_reachable``: 1 while the process reaches Kafka, 0 while it waits for it;
- ``tokenfabric_broker_unreachable_seconds``: how long it has waited (0 while reachable);
- ``tokenfabric_broker_outages_total``: outages this process rode out or is riding out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from processor.apps.ride import BrokerWatch


class BrokerCollector(Collector):
    """The three series of the module docstring, read from ``watch`` at each scrape."""

    def __init__(self, watch: BrokerWatch) -> None:
        self.watch = watch

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        w = self.watch
        yield GaugeMetricFamily(
            "tokenfabric_broker_reachable",
            "1 while this process reaches Kafka, 0 while it waits for a broker to answer",
            value=1 if w.reachable else 0,
        )
        yield GaugeMetricFamily(
            "tokenfabric_broker_unreachable_seconds",
            "Seconds this process has been waiting for Kafka (0 while reachable)",
            value=w.away_for_s(),
        )
        yield CounterMetricFamily(
            "tokenfabric_broker_outages",
            "Broker outages this process rode out (or is riding out) without exiting",
            value=w.outages,
        )
