"""Options several commands share, declared once so they read and fail the same way everywhere."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from processor.apps.ride import OUTAGE_EXIT_S, RideSettings
from processor.core.lanes import CUT_ORDERS, LaneSettings
from processor.core.scheduler import DEADLINES, DispatchSettings
from processor.core.shares import JobPolicy, Shares, ShareSettings
from processor.kafka.config import ConfigError
from processor.kafka.topics import DEFAULT_PREFIX, TopicNames
from processor.kafka.watchdog import CallWatchdog

_PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def add_kafka_arguments(p: argparse.ArgumentParser) -> None:
    """``--bootstrap``, ``--kafka-config``, ``--topic-prefix`` (see processor.kafka.config)."""
    p.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP or the local broker)",
    )
    p.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="librdkafka properties file (security settings, overrides of the defaults)",
    )
    p.add_argument(
        "--topic-prefix",
        default=DEFAULT_PREFIX,
        metavar="P",
        help=f"topic names start with P (default: {DEFAULT_PREFIX})",
    )


def kafka_settings(
    args: argparse.Namespace, *, reach: bool = False, pipeline: bool = False
) -> tuple[dict[str, str], TopicNames]:
    """The client config and topic names the Kafka options ask for; raises ``ConfigError``.

    ``reach``: a short command first checks that the cluster answers, and raises
    :class:`~processor.kafka.reach.BrokerUnreachable` (one line, exit 69, from :func:`main`) if not;
    so does any command given no cluster while no local broker runs (the hint fits its path:
    processor.cli.hints).
    ``pipeline`` (implies ``reach``): a command that reads or feeds an existing pipeline also checks
    that ``--topic-prefix`` names one, and raises
    :class:`~processor.kafka.pipelines.NoSuchPipeline` (a ``ConfigError``: exit 2) naming the
    prefixes that do exist if not.
    """
    from processor.cli.hints import create_command, no_cluster
    from processor.kafka.config import client_config
    from processor.kafka.pipelines import check_pipeline
    from processor.kafka.reach import probe
    from processor.local.broker import local_bootstrap

    if not _PREFIX.match(args.topic_prefix):
        raise ConfigError(
            f"--topic-prefix {args.topic_prefix!r}: 1-100 of A-Z a-z 0-9 . _ - (it starts each topic name)"
        )

    def local_or_hint() -> str:  # no local broker: name the command that starts one on this path
        try:
            return local_bootstrap()
        except ConfigError:
            raise no_cluster(args) from None

    conf = client_config(args.bootstrap, args.kafka_config, fallback=local_or_hint)
    topics = TopicNames(args.topic_prefix)
    if reach or pipeline:
        probe(conf)
    if pipeline:
        check_pipeline(conf, topics, create=create_command(args))
    return conf, topics


def add_trace_reading_arguments(p: argparse.ArgumentParser) -> None:
    """How a trace file becomes items (shared by ``simulate`` and ``produce``)."""
    p.add_argument(
        "--shape-blocks",
        type=int,
        default=1,
        help="mooncake: leading hash ids that make the shape (default: 1)",
    )
    p.add_argument("--model", default="default", help="model of mooncake/azure items (default: default)")
    p.add_argument("--limit", type=int, default=None, help="take only the first N items of the trace")


def check_plot(path: str, *, need_matplotlib: bool = True) -> None:
    """``--plot FILE``'s mistakes, found before the run rather than after it: a folder that is not
    there, and (unless the caller can do without the chart) no matplotlib. Raises ValueError."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise ValueError(f"--plot {path}: there is no folder {folder} (create it, or plot elsewhere)")
    if need_matplotlib and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'tokenfabric[plot]'")


_LANE_FLAGS: tuple[tuple[str, type | tuple[str, ...], str, str], ...] = (
    # flag, its type (or its choices), the LaneSettings or DispatchSettings field of its default, help
    ("--lane-budget", int, "lane_budget", "lanes per (model, shape)"),
    ("--floor-tokens", int, "floor_tokens", "padding that never opens a lane"),
    ("--cap-tokens", int, "cap_tokens", "padding never accepted while a lane can open"),
    ("--start-ratio", float, "start_ratio", "threshold/length with no lanes"),
    ("--full-ratio", float, "full_ratio", "threshold/length with the budget full"),
    ("--idle-ms", int, "idle_ms", "empty lanes go quiet after this long"),
    ("--cut", CUT_ORDERS, "cut", "cut batches from a lane longest first or in arrival order"),
    ("--cut-tokens", int, "cut_tokens", "cut by length: most padding an item may add"),
    (
        "--cut-ratio",
        float,
        "cut_ratio",
        "cut by length: most padding an item may add, as a fraction of the batch's longest",
    ),
    (
        "--lane-pad-multiple",
        int,
        "pad_multiple",
        "rounding used to measure padding when choosing a lane (1 for consumers that pad to 1)",
    ),
    ("--max-wait-ms", int, "max_wait_ms", "an item waiting this long overrides shape stickiness"),
    (
        "--deadline",
        DEADLINES,
        "deadline",
        "overtaking: an overdue item preempts only batches of items max-wait-ms younger; absolute: all",
    ),
)


def add_lane_arguments(p: argparse.ArgumentParser) -> None:
    """The lanes' and dispatch's settings, one flag each (:data:`_LANE_FLAGS`), then ``--no-spread``."""
    defaults = (LaneSettings(), DispatchSettings())
    g = p.add_argument_group("lanes (docs/lanes.md)")
    for flag, kind, field_name, text in _LANE_FLAGS:
        default = next(getattr(d, field_name) for d in defaults if hasattr(d, field_name))
        typed: dict[str, Any] = {"choices": kind} if isinstance(kind, tuple) else {"type": kind}
        g.add_argument(flag, **typed, default=default, help=f"{text} (default: %(default)s)")
    g.add_argument(
        "--no-spread",
        dest="spread",
        action="store_false",
        help="a consumer switching shape takes the most waiting tokens even where another consumer is",
    )


def lanes_from(args: argparse.Namespace) -> tuple[LaneSettings, DispatchSettings]:
    """Raises ValueError naming the bad setting."""
    lanes = LaneSettings(
        lane_budget=args.lane_budget,
        floor_tokens=args.floor_tokens,
        cap_tokens=args.cap_tokens,
        start_ratio=args.start_ratio,
        full_ratio=args.full_ratio,
        idle_ms=args.idle_ms,
        cut=args.cut,
        cut_tokens=args.cut_tokens,
        cut_ratio=args.cut_ratio,
        pad_multiple=args.lane_pad_multiple,
    )
    return lanes, DispatchSettings(max_wait_ms=args.max_wait_ms, deadline=args.deadline, spread=args.spread)


def add_watchdog_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stuck-exit-s",
        type=float,
        default=180.0,
        help="exit with code 75 when a transaction commit blocks this long, so the supervisor restarts "
        "the process (works around librdkafka#5456; default: 180; 0 disables)",
    )


def watchdog_from(
    args: argparse.Namespace, on_stuck: Callable[[str, float], None] | None = None
) -> CallWatchdog | None:
    """The process's watchdog, or None when disabled; ValueError names the flag when it is bad.
    ``on_stuck``: what a stuck call does (default: exit 75; a ride abandons the round instead)."""
    if args.stuck_exit_s < 0:
        raise ValueError(f"--stuck-exit-s must be >= 0 (0 disables), got {args.stuck_exit_s:g}")
    if not args.stuck_exit_s:
        return None
    return CallWatchdog(args.stuck_exit_s) if on_stuck is None else CallWatchdog(args.stuck_exit_s, on_stuck)


def add_outage_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--outage-exit-s",
        type=float,
        default=OUTAGE_EXIT_S,
        metavar="S",
        help="how long to wait out a broker outage (live, not ready; resumed from the last commit) "
        f"before exiting 75 (default: {OUTAGE_EXIT_S:g}; 0: exit at once)",
    )


def ride_from(args: argparse.Namespace) -> RideSettings:
    """The ride's settings from ``--outage-exit-s``; ValueError names the flag when it is bad."""
    return RideSettings(outage_exit_s=args.outage_exit_s)


def add_share_arguments(p: argparse.ArgumentParser) -> None:
    """Token shares between jobs (docs/shares.md): weights, quotas and the sticky slack."""
    d = ShareSettings()
    g = p.add_argument_group("token shares between jobs (docs/shares.md)")
    g.add_argument(
        "--job-weight",
        action="append",
        default=[],
        metavar="JOB=W",
        help="a job's weight (default 1; repeatable; JOB '' is items without a job)",
    )
    g.add_argument(
        "--job-rate", action="append", default=[], metavar="JOB=N", help="cap a job at N routed tokens/s"
    )
    g.add_argument(
        "--job-max-tokens", action="append", default=[], metavar="JOB=N", help="cap a job at N routed tokens"
    )
    g.add_argument(
        "--share-slack-tokens",
        type=int,
        default=d.slack_tokens,
        help="how far a card's job may run ahead of its share before the card leaves it "
        f"(default: {d.slack_tokens})",
    )


def _job_values(flag: str, texts: list[str], kind: type[float] | type[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for text in texts:
        job, eq, value = text.rpartition("=")
        if not eq:
            raise ValueError(f"{flag} {text!r}: expected JOB=NUMBER")
        try:
            out[job] = kind(value)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {value!r} is not a number") from None
    return out


def shares_from(args: argparse.Namespace) -> Shares:
    """The job policies the share flags give; ValueError names the bad flag."""
    weights = _job_values("--job-weight", args.job_weight, float)
    rates = _job_values("--job-rate", args.job_rate, float)
    totals = _job_values("--job-max-tokens", args.job_max_tokens, int)
    shares = Shares(ShareSettings(slack_tokens=args.share_slack_tokens))
    for job in {**weights, **rates, **totals}:
        try:
            policy = JobPolicy(
                weight=weights.get(job, 1.0),
                max_tokens_per_s=rates.get(job),
                max_tokens=None if job not in totals else int(totals[job]),
            )
        except ValueError as exc:
            raise ValueError(f"job {job!r}: {exc}") from None
        shares.set_policy(job, policy)
    return shares


def add_job_policy_arguments(p: argparse.ArgumentParser) -> None:
    """One job's weight and quotas (``submit``, ``share``: docs/shares.md)."""
    g = p.add_argument_group("token share (docs/shares.md)")
    g.add_argument("--weight", type=float, default=None, help="the job's weight (default: 1)")
    g.add_argument("--max-tokens-per-s", type=float, default=None, help="cap in routed tokens per second")
    g.add_argument("--max-tokens", type=int, default=None, help="cap in routed tokens in all")
    g.add_argument(
        "--burst-ms",
        type=int,
        default=JobPolicy().burst_ms,
        help="the rate cap's bucket, in ms of its rate (default: %(default)s)",
    )


def job_policy_from(args: argparse.Namespace) -> JobPolicy | None:
    """The policy the flags give, or None when none of weight and quotas is given; ValueError
    names the problem."""
    if args.weight is None and args.max_tokens_per_s is None and args.max_tokens is None:
        return None
    return JobPolicy(
        weight=1.0 if args.weight is None else args.weight,
        max_tokens_per_s=args.max_tokens_per_s,
        max_tokens=args.max_tokens,
        burst_ms=args.burst_ms,
    )


def describe_policy(policy: JobPolicy) -> str:
    """``weight 4, at most 1,000 tokens/s, at most 2,000,000 tokens`` (the parts that are set)."""
    parts = [f"weight {policy.weight:g}"]
    if policy.max_tokens_per_s is not None:
        parts.append(f"at most {policy.max_tokens_per_s:,.0f} tokens/s (bucket {policy.burst_ms:,} ms)")
    if policy.max_tokens is not None:
        parts.append(f"at most {policy.max_tokens:,} tokens")
    return ", ".join(parts)


#: The sim engine's flags of ``consumer`` and ``plain-queue``, and the engine option each sets.
SIM_FLAGS = {
    "tps": "tps",
    "overhead_ms": "overhead_ms",
    "cache": "cache",
    "time_scale": "time_scale",
    "seed": "seed",
}


def engine_options(args: argparse.Namespace) -> dict[str, str]:
    """The engine options of ``--engine-opt KEY=VALUE`` and the sim engine's own flags (SIM_FLAGS)."""
    options: dict[str, str] = {}
    for flag, key in SIM_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if args.engine != "sim":
            raise ValueError(f"--{flag.replace('_', '-')} applies to --engine sim only")
        options[key] = value
    for pair in args.engine_opt:
        key, value = engine_opt(pair)
        options[key] = value
    return options


def engine_opt(pair: str) -> tuple[str, str]:
    """One ``--engine-opt KEY=VALUE``, split; ValueError saying what is wrong otherwise."""
    key, sep, value = pair.partition("=")
    if not sep or not key:
        raise ValueError(f"--engine-opt {pair!r}: expected KEY=VALUE")
    return key, value


def _announce_batch_finish(sig: signal.Signals) -> None:
    logging.getLogger("tokenfabric.consumer").info("%s: finishing the current batch, then exiting", sig.name)


def set_from_signal(stop: threading.Event) -> None:
    """Set ``stop`` from a signal handler, on a thread of its own.

    Not ``stop.set()`` in the handler: Python runs a handler on the main thread between two
    bytecodes, possibly while that thread holds the event's lock inside ``stop.wait()``; ``set``
    would then wait for that lock for ever (a ``status --watch`` hung on its first SIGINT). The
    thread sets it as soon as the main thread lets go of the lock.
    """
    threading.Thread(target=stop.set, name="stop-signal", daemon=True).start()


def install_stop_handlers(
    stop: threading.Event, announce: Callable[[signal.Signals], None] = _announce_batch_finish
) -> None:
    """First SIGINT/SIGTERM: ``announce`` it and set ``stop``; the caller finishes what it is doing
    and exits cleanly. Second: abort now (KeyboardInterrupt).

    Why an event and not KeyboardInterrupt first: raised while librdkafka is calling back into
    Python, the interrupt surfaces as a SystemError from whatever C function runs next, and the
    command dies with a traceback instead of ending its work.
    """

    signalled: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        if signalled:
            raise KeyboardInterrupt
        signalled.append(signum)
        announce(signal.Signals(signum))
        set_from_signal(stop)

    if threading.current_thread() is not threading.main_thread():
        return  # signals are delivered to the main thread only; an embedding caller owns them
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
