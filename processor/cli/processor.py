"""``tokenfabric processor``: run the stream processor until SIGTERM or SIGINT.

With no broker answering at start it says so once and waits (processor.kafka.reach.wait_for_cluster).

Exit status (processor.kafka.exits; docs/operations.md has the table): 0 after a clean stop; 2 for bad
arguments or Kafka settings, and for a ``--group`` the topics contradict (WrongSettings); 75
(``EX_TEMPFAIL``) when a run-time failure left nothing committed past the last commit and a restart
recovers (missing topics, a produce not delivered, a retriable or abortable Kafka error, a stuck commit:
processor.kafka.watchdog, a transaction the broker aborted after a pause) and that is not a broker outage,
or an outage longer than ``--outage-exit-s``: an outage is waited out in the process
(processor.apps.ride: live, not ready, resumed from the last commit); 78 when a newer process with
the same ``--instance`` took over (do not restart); 1 otherwise (a fatal Kafka error, a ledger that does
not balance: a bug, logged with its trace).

It also serves ``/metrics``, ``/healthz`` and ``/readyz`` (processor.ops.metrics, processor.ops.health) on
127.0.0.1:9464 unless ``--metrics-port 0``; the server lives exactly as long as the service.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from processor.cli.logs import add_log_arguments, setup_logging
from processor.cli.options import (
    add_kafka_arguments,
    add_lane_arguments,
    add_outage_argument,
    add_watchdog_argument,
    kafka_settings,
    lanes_from,
    ride_from,
    watchdog_from,
)
from processor.cli.serve import Serving, logged_exit
from processor.core.shares import ShareSettings
from processor.kafka.topics import RETENTION_MS
from processor.ops.health import PROCESSOR_PORT, add_http_arguments, http_settings

if TYPE_CHECKING:
    from processor.apps.settings import ProcessorSettings

PROG = "tokenfabric processor"


def configure(p: argparse.ArgumentParser) -> None:
    add_kafka_arguments(p)
    from processor.cli.schemas import add_registry_argument, add_results_framing_argument

    add_registry_argument(p)
    add_results_framing_argument(p)
    p.add_argument(
        "--instance",
        default="processor-0",
        help="this instance's id, which names its checkpoints (default: processor-0)",
    )
    p.add_argument(
        "--group",
        default="",
        help="ingest consumer group (default: <topic prefix>-processor, the pipeline's)",
    )
    p.add_argument(
        "--max-waiting-tokens",
        type=int,
        default=0,
        help="pause ingest while this many tokens wait in lanes (backpressure; default 0: no cap)",
    )
    p.add_argument(
        "--at-least-once",
        action="store_true",
        help="no transactions: faster, but a crash may dispatch items twice (docs/reliability.md)",
    )
    p.add_argument(
        "--commit-interval-ms",
        type=int,
        default=500,
        help="how often progress, offsets and a ledger checkpoint are committed (default: 500)",
    )
    p.add_argument(
        "--session-timeout-ms",
        type=int,
        default=45_000,
        help="how long the group waits for a silent instance before its partitions go to the others "
        "(default: 45000; the broker allows 6000 and up)",
    )
    p.add_argument(
        "--group-protocol",
        choices=("consumer", "classic"),
        default="consumer",
        help="the ingest group's rebalance protocol: consumer (KIP-848, Kafka 4.0+: only moved "
        "partitions stop) or classic (eager: every rebalance stops every instance; for older "
        "brokers) (default: consumer)",
    )
    p.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=10_000,
        help="after a crash, how long the broker waits before aborting the open transaction; the new "
        "owner of its partitions restores after at most this long (default: 10000)",
    )
    p.add_argument(
        "--dedupe-window-ms",
        type=int,
        default=RETENTION_MS,
        help="an item_id an ingest partition took within this long is a producer's repeat: dead-lettered "
        "as duplicate-item-id, not run (default: 604800000, the ingest retention topics create sets; "
        "keep it >= your ingest retention; 0 turns dedupe off)",
    )
    p.add_argument(
        "--dedupe-max-ids",
        type=int,
        default=4_000_000,
        help="most item ids one ingest partition remembers (15-24 bytes each); past it the oldest are "
        "forgotten early (default: 4000000; 0: no cap)",
    )
    add_watchdog_argument(p)
    add_outage_argument(p)
    add_log_arguments(p)
    add_lane_arguments(p)
    g = p.add_argument_group("token shares between jobs (docs/shares.md; weights: 'tokenfabric share')")
    g.add_argument(
        "--share-slack-tokens",
        type=int,
        default=ShareSettings().slack_tokens,
        help="how far a card's job may run ahead of its share before the card leaves it "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--max-jobs",
        type=int,
        default=ShareSettings().max_jobs,
        help="most jobs with lanes and books of their own; the rest count as no job (default: %(default)s)",
    )
    add_http_arguments(p, PROCESSOR_PORT, health_checks=True)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.apps.membership import part_from
    from processor.apps.ride import BrokerWatch, Current, Ride, StuckSignal
    from processor.apps.schema_registry import RegistryRefused
    from processor.apps.service import ProcessorService
    from processor.cli.schemas import framing_from
    from processor.kafka.config import ConfigError, describe
    from processor.kafka.exits import Superseded, TransientFailure, WrongSettings
    from processor.kafka.rdlog import demote_outage_lines
    from processor.ops.broker_metrics import BrokerCollector
    from processor.ops.health import ProcessorHealth, RideHealth
    from processor.ops.kafka_stats import KafkaStats
    from processor.ops.metrics import processor_registry
    from processor.wire.registry_framing import RegistryUnavailable

    setup_logging(args.log_level, args.log_format)
    demote_outage_lines()  # the ride says an outage once; librdkafka's own lines are DEBUG
    stuck = StuckSignal()
    try:
        settings = _settings(args)
        http = http_settings(args, PROCESSOR_PORT)
        watchdog = watchdog_from(args, stuck)
        framing = framing_from(args)
        ride_settings = ride_from(args)
        conf, topics = kafka_settings(args)  # the arguments first: their mistakes are the real ones
    except (ConfigError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (RegistryUnavailable, RegistryRefused) as exc:  # --results-framing registry: its id
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    log = logging.getLogger("tokenfabric.processor")
    log.info("kafka client settings: %s", describe(conf))
    with Serving(PROG, log) as serving:
        if not serving.cluster_answered(conf):  # no broker yet: said once, retried until one answers
            return 0
        kafka_stats = KafkaStats()  # librdkafka's statistics for /metrics, reported only when it is served
        client_conf = kafka_stats.attach(conf) if http is not None else conf

        def fresh(resuming: bool = False) -> ProcessorService:
            service = ProcessorService(client_conf, topics, settings, framing=framing)
            service.watchdog = watchdog
            service.resuming = resuming
            return service

        current = Current(fresh())
        rounds = iter([current.target])  # the first round runs the service built for the server

        who = f"processor {settings.instance} of pipeline {topics.prefix}"

        def make_round() -> Callable[[threading.Event], None]:
            leaves = topics.ingest if settings.group_protocol == "consumer" else None
            part_from(current.target.parting, who, leaves)  # the last round's member leaves the group
            return current.switch(next(rounds, None) or fresh(resuming=True)).run

        watch = BrokerWatch()
        ride = Ride(make_round, conf, who, log, ride_settings, watch, stuck)
        service = cast("ProcessorService", current)
        if http is not None:
            health = RideHealth(ProcessorHealth(service, http.step_timeout_s, http.broker_timeout_s), watch)
            registry = processor_registry(service, extra=[kafka_stats, BrokerCollector(watch)])
            if not serving.serve_http(http, registry, health):
                return 2
        try:
            ride.run(serving.stop)
        except (KafkaException, TransientFailure, Superseded, WrongSettings) as exc:
            return logged_exit(log, exc)
    c = service.counters
    log.info(
        "stopped: consumed %d, dead-lettered %d, batches %d, completions %d",
        c.consumed,
        c.dead_lettered,
        c.batches_produced,
        c.completions,
    )
    return 0


def _settings(args: argparse.Namespace) -> ProcessorSettings:
    """The processor's settings from its flags; raises ValueError naming the flag."""
    from processor.apps.settings import ProcessorSettings
    from processor.cli.schemas import results_schema_id

    lanes, dispatch = lanes_from(args)
    return ProcessorSettings(
        instance=args.instance,
        group_id=args.group,
        lanes=lanes,
        dispatch=dispatch,
        shares=ShareSettings(slack_tokens=args.share_slack_tokens, max_jobs=args.max_jobs),
        commit_interval_ms=args.commit_interval_ms,
        exactly_once=not args.at_least_once,
        max_waiting_tokens=args.max_waiting_tokens,
        session_timeout_ms=args.session_timeout_ms,
        group_protocol=args.group_protocol,
        transaction_timeout_ms=args.transaction_timeout_ms,
        dedupe_window_ms=args.dedupe_window_ms,
        dedupe_max_ids=args.dedupe_max_ids,
        results_schema_id=results_schema_id(args),
    )
