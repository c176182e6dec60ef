"""``tokenfabric consumer``: run one GPU consumer app (processor.apps.consumer) with an engine.

With no broker answering at start it says so once and waits (processor.kafka.reach.wait_for_cluster).

Exit status: 0 after a clean stop (SIGTERM/SIGINT, ``--max-batches``, ``--idle-exit-s``) or a
``--retire``; 2 for bad arguments or Kafka settings; 75 (``EX_TEMPFAIL``) when a run-time failure left
the batch uncommitted and a restart recovers (completions not delivered, a retriable or abortable Kafka
error, a stuck commit: processor.kafka.watchdog, a transaction the broker aborted after a pause); 78 when a
newer process with the same ``--id`` took over (do not restart); 1 for any other failure at run time
(a fatal Kafka error). docs/operations.md has the table.
A second SIGINT/SIGTERM while the current batch finishes aborts at once (the batch runs again on
restart: its offset was not committed).
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
    add_outage_argument,
    add_watchdog_argument,
    engine_options,
    install_stop_handlers,
    kafka_settings,
    ride_from,
    watchdog_from,
)
from processor.cli.schemas import add_registry_argument, add_results_framing_argument, results_schema_id
from processor.cli.serve import Serving, printed_exit
from processor.core.contract import BATCHING_MODES, Contract
from processor.core.serving import SEPARATOR, serving_key
from processor.engines.base import ENGINES
from processor.ops.health import CONSUMER_PORT, add_http_arguments, http_settings
from processor.wire.records import COMPLETION_FORMS

if TYPE_CHECKING:
    from processor.apps.consumer_batches import ConsumerStats
    from processor.apps.settings import ConsumerSettings
    from processor.engines.base import Engine

PROG = "tokenfabric consumer"


#: ``--flag`` -> sim engine option; passed only to ``--engine sim``.
def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", required=True, help="consumer id: names its batch topic and consumer group")
    p.add_argument("--model", help="the model this consumer serves (required unless --retire)")
    p.add_argument(
        "--adapter",
        default="",
        metavar="NAME",
        help="the one LoRA adapter of --model this consumer serves (default: the base model); run one "
        "consumer per adapter, against the same server if it serves several (docs/consumers.md, Adapters)",
    )
    p.add_argument(
        "--budget", type=int, help="padded tokens per batch (required in tokens batching unless --retire)"
    )
    p.add_argument("--items", type=int, help="most items per batch (required unless --retire)")
    p.add_argument("--pad", type=int, default=8, help="pad multiple (default: 8)")
    p.add_argument("--inflight", type=int, default=2, help="batches in flight at once (default: 2)")
    batching = p.add_argument_group("batching mode (docs/consumer-contract.md, Batching modes)")
    batching.add_argument(
        "--batching",
        default="tokens",
        choices=BATCHING_MODES,
        help="what bounds a batch: rows (--items only), tokens (--budget), memory (--memory-bytes); "
        "default: tokens",
    )
    batching.add_argument("--memory-bytes", type=int, help="memory: KV-cache bytes one batch may fill")
    batching.add_argument(
        "--kv-bytes-per-token", type=int, help="memory: KV-cache bytes per token of the model"
    )
    batching.add_argument(
        "--default-output-tokens",
        type=int,
        help="memory: output tokens counted for an item without an output budget (default: 0)",
    )
    p.add_argument("--engine", default="sim", choices=sorted(ENGINES), help="engine (default: sim)")
    p.add_argument(
        "--engine-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine option (repeatable; overrides the sim flags below)",
    )
    sim = p.add_argument_group("sim engine")
    sim.add_argument("--tps", help="modelled prefill tokens/s (default: 50000)")
    sim.add_argument("--overhead-ms", help="modelled fixed cost per batch in ms (default: 5)")
    sim.add_argument("--cache", help="prefix-cache capacity in shapes (default: 4)")
    sim.add_argument("--time-scale", help="sleep this fraction of the modelled time (default: 1; 0: instant)")
    sim.add_argument("--seed", help="seed of the modelled jitter (default: 0)")
    p.add_argument("--max-batches", type=int, help="exit after N batches (tests)")
    p.add_argument(
        "--at-least-once",
        action="store_true",
        help="commit offsets after flushing completions instead of in one transaction with them",
    )
    p.add_argument(
        "--completions",
        default="batch",
        choices=COMPLETION_FORMS,
        help="how completions are written: batch (one CompletionBatch message per batch) or item (one "
        "Completion per item, for results readers that only know that record); default: batch",
    )
    add_registry_argument(p)
    add_results_framing_argument(p)
    p.add_argument("--idle-exit-s", type=float, help="exit after S seconds without a batch (demo)")
    p.add_argument(
        "--retire", action="store_true", help="publish a tombstone for this consumer's contract and exit"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log one line per batch (--log-level DEBUG)")
    add_log_arguments(p)
    add_kafka_arguments(p)
    add_watchdog_argument(p)
    add_outage_argument(p)
    add_http_arguments(p, CONSUMER_PORT, health_checks=False)


#: ``--budget`` of a rows- or memory-batching consumer that gives none: the token budget does not bound
#: its batches, so it is announced as the largest Avro int (status and metrics still show a number).
UNBOUNDED_TOKENS = (1 << 31) - 1
MEMORY_FLAGS = ("memory_bytes", "kv_bytes_per_token", "default_output_tokens")


def _contract(args: argparse.Namespace) -> Contract:
    """The contract the flags describe; its model is the serving key of ``--model`` and ``--adapter``.
    Memory flags outside memory batching, a memory contract without its two numbers, or a model or
    adapter name holding the serving key's separator are refused naming the flags; ``Contract``
    refuses bad values."""
    for flag, name in (("--model", args.model), ("--adapter", args.adapter)):
        if SEPARATOR in name:
            raise ValueError(
                f"{flag} {name!r} contains {SEPARATOR!r}: the processor keys an adapter's work as "
                f"model{SEPARATOR}adapter, so neither name may hold it"
            )
    given = [n for n in MEMORY_FLAGS if getattr(args, n) is not None]
    if args.batching != "memory" and given:
        raise ValueError(f"--{given[0].replace('_', '-')} applies to --batching memory only")
    missing = [f"--{n.replace('_', '-')}" for n in MEMORY_FLAGS[:2] if getattr(args, n) is None]
    if args.batching == "memory" and missing:
        raise ValueError(f"--batching memory needs {' and '.join(missing)}")
    return Contract(
        args.id,
        serving_key(args.model, args.adapter),
        UNBOUNDED_TOKENS if args.budget is None else args.budget,
        args.items,
        args.pad,
        args.inflight,
        batching=args.batching,
        memory_bytes=args.memory_bytes or 0,
        kv_bytes_per_token=args.kv_bytes_per_token or 0,
        default_output_tokens=args.default_output_tokens or 0,
    )


def _settings(args: argparse.Namespace) -> ConsumerSettings:
    """The app's settings from the flags; ValueError naming a flag that is missing or cannot work."""
    from processor.apps.settings import ConsumerSettings

    required = ("model", "budget", "items") if args.batching == "tokens" else ("model", "items")
    missing = [f"--{n}" for n in required if getattr(args, n) is None]
    if missing:
        raise ValueError(f"{' and '.join(missing)} required to run a consumer")
    return ConsumerSettings(
        max_batches=args.max_batches,
        idle_exit_s=args.idle_exit_s,
        completions=args.completions,
        results_schema_id=results_schema_id(args),
        exactly_once=not args.at_least_once,
    )


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.apps.consumer import ConsumerApp, ConsumerAppError, ConsumerHooks, retire
    from processor.apps.ride import BrokerWatch, Current, Ride, StuckSignal
    from processor.apps.schema_registry import RegistryRefused
    from processor.core.contract import CONSUMER_ID
    from processor.engines.base import make_engine
    from processor.kafka.config import ConfigError, describe
    from processor.kafka.exits import Superseded, TransientFailure
    from processor.kafka.rdlog import demote_outage_lines
    from processor.ops.broker_metrics import BrokerCollector
    from processor.ops.consumer_metrics import ConsumerMetrics
    from processor.ops.health import RideHealth, ServingHealth
    from processor.wire.registry_framing import RegistryUnavailable

    stuck = StuckSignal()
    try:
        if not CONSUMER_ID.match(args.id):
            raise ValueError(f"--id {args.id!r}: use 1-200 of A-Z a-z 0-9 . _ - (it names a topic)")
        if args.retire:
            conf, topics = kafka_settings(args, reach=True)
            retire(conf, topics, args.id)
            print(f"retired consumer {args.id}: tombstone on {topics.contracts}")
            return 0
        settings = _settings(args)
        contract = _contract(args)
        http = http_settings(args, CONSUMER_PORT)
        watchdog = watchdog_from(args, stuck)
        ride_settings = ride_from(args)
        options = engine_options(args)
        conf, topics = kafka_settings(args)  # the arguments first: their mistakes are the real ones
        engine = make_engine(args.engine, options)
    except (ValueError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (KafkaException, ConsumerAppError, RegistryUnavailable, RegistryRefused) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1

    setup_logging("DEBUG" if args.verbose else args.log_level, args.log_format)
    demote_outage_lines()  # the ride says an outage once; librdkafka's own lines are DEBUG
    log = logging.getLogger("tokenfabric.consumer")
    log.info("kafka client settings: %s", describe(conf))
    metrics = ConsumerMetrics(contract.consumer)
    client_conf = metrics.kafka_conf(conf) if http is not None else conf

    watch = BrokerWatch()

    def fresh(engine: Engine) -> ConsumerApp:
        hooks = ConsumerHooks(**metrics.hooks())
        app = ConsumerApp(client_conf, topics, contract, engine, settings, hooks=hooks, watchdog=watchdog)
        began_after = watch.outages
        if ride_settings.outage_exit_s > 0:  # riding outages out: fresh clients after one (ConsumerApp.stale)
            app.stale = lambda: watch.outages > began_after
        return app

    current = Current(fresh(engine))
    rounds = iter([current.target])  # the first round runs the app built with the first engine

    def make_round() -> Callable[[threading.Event], ConsumerStats]:
        app = next(rounds, None)
        if app is None:  # a later round: the last one's run closed its engine
            app = fresh(make_engine(args.engine, options))
            app.resuming = True
        return current.switch(app).run

    who = f"consumer {contract.consumer} of pipeline {topics.prefix}"
    ride = Ride(make_round, conf, who, log, ride_settings, watch, stuck)
    metrics.watch(cast("ConsumerApp", current))
    metrics.registry.register(BrokerCollector(watch))
    with Serving(PROG, log, install_stop_handlers, said_on_stderr=True) as serving:
        if not serving.serve_http(http, metrics.registry, RideHealth(ServingHealth(), watch)):
            engine.close()
            return 2
        try:
            if not serving.cluster_answered(conf):
                return 0
            stats = ride.run(serving.stop)
        except (KafkaException, ConsumerAppError, TransientFailure, Superseded) as exc:
            return printed_exit(PROG, exc)
        except KeyboardInterrupt:
            current.target.engine.close()  # the round's thread is left as it is; the process ends
            print(f"{PROG}: aborted; the unfinished batch runs again on restart", file=sys.stderr)
            return 130
    if stats is None:  # stopped while waiting for the broker
        stats = current.target.stats
    print(f"consumer {args.id}: {stats.summary()}")
    return 0
