"""``tokenfabric status``: what the pipeline holds and who is alive, read from its topics.

Plain text that fits the terminal (80 columns when there is none: ``kubectl exec`` without ``-t``,
a pipe, a log) without cutting anything: a line too long is folded, never ellipsized, and an id is
never split. ``--json`` prints the same report as one JSON object (``processor/ops/status.schema.json``,
docs/operations.md "Status"); ``--watch`` refreshes it with the token rates and the backlog's ETA.

Exit codes: 0; 1 when Kafka fails mid-read or a retirement is refused; 2 for bad arguments. With
``--watch`` a broker outage is no exit: each refresh says ``KAFKA UNREACHABLE ...`` until it answers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Iterable

from processor.cli.options import add_kafka_arguments, install_stop_handlers, kafka_settings
from processor.core.accounting import cached_prompt_share
from processor.kafka.outage import is_outage
from processor.kafka.topics import TopicNames
from processor.ops.status import (
    DEFAULT_STALE_S,
    SCHEMA_PATH,
    ConsumerRow,
    PromptFigures,
    StatusReport,
    gather,
    report,
    with_rates,
)
from processor.ops.status_view import StatusView


def configure(p: argparse.ArgumentParser) -> None:
    add_kafka_arguments(p)
    p.add_argument(
        "--group", default="",
        help="the processors' ingest consumer group (default: <topic prefix>-processor)"
    )  # fmt: skip
    p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C, with tokens/s and the ETA")
    p.add_argument("--interval-s", type=float, default=2.0, help="refresh interval with --watch (default: 2)")
    p.add_argument(
        "--stale-s",
        type=float,
        default=DEFAULT_STALE_S,
        metavar="S",
        help=f"mark a processor checkpoint or a consumer's last sign of life older than S s STALE "
        f"(default: {DEFAULT_STALE_S:g})",
    )
    p.add_argument("--json", action="store_true", help="one JSON object (JSON lines with --watch)")
    p.add_argument("--schema", action="store_true", help="print the JSON Schema of --json and exit")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--forget-processor",
        metavar="INSTANCE",
        help="stop listing a processor instance that is gone for good (stale past --stale-s)",
    )
    g.add_argument(
        "--retire-consumer",
        metavar="ID",
        help="withdraw a consumer that is gone (stale past --stale-s): its contract's tombstone",
    )


# -- text -----------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2%}" if x < 0.01 else f"{x:.1%}"


def _age(s: float | None) -> str:
    """0.4 s, 12 s, 5m12s, 3h05m, 2d03h; '-' when unknown."""
    if s is None:
        return "-"
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h < 24 else f"{h // 24}d{h % 24:02d}h"


def _columns(rows: list[list[str]], indent: str, right: Iterable[int] = ()) -> list[str]:
    """Rows aligned in columns (``right``: indices aligned right), two spaces apart."""
    if not rows:
        return []
    right = set(right)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(row: list[str]) -> str:
        cells = zip(row, widths, strict=True)
        return indent + "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(cells))

    return [line(r).rstrip() for r in rows]


def fold(lines: Iterable[str], width: int) -> list[str]:
    """Each line as is if it fits, else folded at spaces, continued 4 columns deeper. Words (ids,
    numbers) are never split: a single word wider than ``width`` stays whole on its own line."""
    out: list[str] = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()))
        out.extend(
            textwrap.wrap(
                line.strip(),
                width,
                initial_indent=indent,
                subsequent_indent=indent + "    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return out


def _consumer_lines(row: ConsumerRow, stale_s: float) -> list[str]:
    c = row.contract
    if row.state == "up":
        life = f"up: {row.members} member{'s' if row.members != 1 else ''} in its group"
    elif row.state == "silent":
        quiet = "-" if row.last_seen_age_s is None else _age(row.last_seen_age_s)
        life = f"SILENT: in its group, batches wait for it, no answer for {quiet}"
    else:
        seen = "never" if row.last_seen_age_s is None else f"{_age(row.last_seen_age_s)} ago"
        not_in = "not in its group" if row.members is not None else "group not readable"
        life = f"{'STALE' if row.state == 'stale' else 'down'}: {not_in}, last seen {seen}"
    done = row.last_completion_age_s
    life += ", no completion seen" if done is None else f", last completion {_age(done)} ago"
    unread = "-" if row.unread_batches is None else f"{row.unread_batches:,}"
    slots = " ".join(f"{i}:{n}" for i, n in row.slots.items()) or "-"
    oversized = f" ({row.oversized_batches:,} oversized batches apart)" if row.oversized_batches else ""
    return [
        f"  {row.consumer}  model {row.model}",
        f"    {life}",
        f"    contract  {c.budget_tokens:,} tokens, {c.max_items} items, pad {c.pad_multiple}, "
        f"{c.max_inflight} in flight ({c.batching} batching)",
        f"    batches   {row.in_flight_batches}/{c.max_inflight} in flight, {unread} unread on its topic, "
        f"slots {slots}",
        f"    tokens    {row.routed_tokens:,} routed, {row.completed_tokens:,} completed "
        f"in {row.batches:,} batches",
        f"    fill      {_pct(row.budget_fill)} of budget{oversized}, "
        f"padding waste {_pct(row.padding_waste)}",
        f"    cache     {_pct(row.cache_hit_rate)} hits, {row.shape_switches:,} shape switches",
        f"    prompts   {_prompts(row.prompts)}",
    ]


def _prompts(p: PromptFigures) -> str:
    """Completed prompt tokens by how the engines served them (measured, as the consumers reported)."""
    if not p.counted:
        return "not counted (a checkpoint without prompt counters: docs/engine-openai.md)"
    return (
        f"{p.cached_tokens:,} tokens from the prefix cache, {p.prefill_tokens:,} computed "
        f"({_pct(p.cached_share)} cached)"
    )


def render_text(rep: StatusReport, width: int = 80) -> str:
    """The report as lines no wider than ``width`` (folded, never cut)."""
    lines = [f"tokenfabric status  {rep.prefix}  {rep.time}", *_rate_lines(rep), ""]
    lines += _ledger_lines(rep)
    lines += ["", *_flow_lines(rep), ""]
    lines += _processor_lines(rep)
    lines += _unserved_lines(rep)
    lines += _job_lines(rep)
    lines += ["", f"consumers (last sign of life; STALE past {rep.stale_after_s:g} s)"]
    lines += _consumers_section(rep)
    return "\n".join(fold(lines, width))


#: Past this many consumers, those that are up get one line each and only the others every detail.
DETAILED_CONSUMERS = 8


def _consumers_section(rep: StatusReport) -> list[str]:
    """Every consumer in detail when there are few. With many (a fleet), what an operator needs
    first: a count by state and the slots in use, then in detail the consumers that are not up
    (SILENT, STALE, down), then one line per consumer that is up."""
    rows = rep.consumers
    if not rows:
        return ["  none has announced a contract"]
    if len(rows) <= DETAILED_CONSUMERS:
        return [line for row in rows for line in _consumer_lines(row, rep.stale_after_s)]
    states = {state: sum(1 for r in rows if r.state == state) for state in ("up", "silent", "stale", "down")}
    held = sum(r.in_flight_batches for r in rows)
    slots = sum(r.contract.max_inflight for r in rows)
    counts = ", ".join(f"{n} {s if s == 'up' else s.upper()}" for s, n in states.items() if n)
    out = [f"  {len(rows)} consumers: {counts}; {held:,} of {slots:,} batches in flight"]
    for row in (r for r in rows if r.state != "up"):
        out += _consumer_lines(row, rep.stale_after_s)
    up = [r for r in rows if r.state == "up"]
    if up:
        out.append("  up: consumer, model, batches in flight, fill, padding waste, last completion")
        out += _columns([_consumer_row(r) for r in up], "    ", right=(2, 3, 4, 5))
    return out


def _consumer_row(row: ConsumerRow) -> list[str]:
    done = row.last_completion_age_s
    return [
        row.consumer,
        row.model,
        f"{row.in_flight_batches}/{row.contract.max_inflight}",
        _pct(row.budget_fill),
        _pct(row.padding_waste),
        "-" if done is None else _age(done),
    ]


def _rate_lines(rep: StatusReport) -> list[str]:
    """``--watch``: the token rates since the last refresh and the backlog's ETA (none before)."""
    if rep.rates is None:
        return []
    r = rep.rates
    eta = "- (nothing completes)" if r.eta_s is None else _age(r.eta_s)
    return [
        f"rates    received {r.received_tokens_per_s:,.0f} tok/s, completed "
        f"{r.completed_tokens_per_s:,.0f} tok/s (last {r.interval_s:.1f} s)",
        f"backlog  {r.backlog_tokens:,} tokens queued or in flight, ETA {eta}",
    ]


def _ledger_lines(rep: StatusReport) -> list[str]:
    ledger = [["ledger", "items", "tokens"]]
    ledger += [
        [f"  {stage.replace('_', ' ')}", f"{t.items:,}", f"{t.tokens:,}"] for stage, t in rep.ledger.items()
    ]
    ledger.append(["  dead-lettered", f"{rep.dead_lettered_items:,}", ""])
    return _columns(ledger, "", right=(1, 2))


def _flow_lines(rep: StatusReport) -> list[str]:
    """Ingest, lanes, padding and prompts: one line each."""
    ing = rep.ingest
    state = {
        "flowing": "flowing",
        "paused": "PAUSED by backpressure (--max-waiting-tokens)",
        "stalled": "STALLED: no live processor"
        if not any(p.state == "live" for p in rep.processors)
        else f"STALLED: {ing.stalled_partitions} of {ing.partitions} partitions have no live owner "
        "(owner STALE)",
    }[ing.state]
    lag = "-" if ing.uncommitted_messages is None else f"{ing.uncommitted_messages:,}"
    lanes = rep.lanes
    return [
        f"ingest   {state}; {lag} of {ing.messages:,} messages not yet committed",
        f"lanes    {lanes.in_use:,} in use (pressure {_pct(lanes.pressure)}), "
        f"{lanes.shape_switches:,} shape switches",
        f"padding  {_pct(rep.padding_waste)} waste; cache hit rate {_pct(rep.cache_hit_rate)}",
        f"prompts  {_prompts(rep.prompts)}",
    ]


def _processor_lines(rep: StatusReport) -> list[str]:
    lines = [f"processors (age of the last checkpoint; STALE past {rep.stale_after_s:g} s)"]
    rows = [
        [p.instance, "live" if p.state == "live" else "STALE", _age(p.checkpoint_age_s),
         f"{p.owned_partitions}/{p.ingest_partitions} partitions"
         + (f" ({p.handed_over} handed over)" if p.handed_over else "")]
        for p in rep.processors
    ]  # fmt: skip
    lines += _columns(rows, "  ", right=(2,)) or ["  none has checkpointed"]
    if rep.retired_processors:
        lines.append("  retired (--forget-processor): " + ", ".join(rep.retired_processors))
    return lines


def _unserved_lines(rep: StatusReport) -> list[str]:
    if not rep.unserved:
        return []
    rows = [
        [u.model, f"{u.items:,} items", f"{u.tokens:,} tokens",
         f"({', '.join(u.consumers)} not up)" if u.consumers else "(no contract)"]
        for u in rep.unserved
    ]  # fmt: skip
    header = "UNSERVED: items wait for a model (or model@adapter) no live consumer serves"
    return ["", header, *_columns(rows, "  ", right=(1, 2))]


def _job_lines(rep: StatusReport) -> list[str]:
    """Each job's weight, quota, tokens by stage, cached share and padding (docs/shares.md)."""
    if not rep.jobs:
        return []
    rows = [["job", "weight", "quota", "received", "routed", "completed", "cached", "padding"]]
    for j in rep.jobs:
        quota = (
            ", ".join(
                [
                    *([f"{j.max_tokens_per_s:,}/s"] if j.max_tokens_per_s is not None else []),
                    *([f"{j.max_tokens:,} in all"] if j.max_tokens is not None else []),
                ]
            )
            or "-"
        )
        tokens = [f"{j.tokens[stage]:,}" for stage in ("received", "routed", "completed")]
        cap = quota + (" CAPPED" if j.capped else "")
        cached = _pct(cached_prompt_share(j.tokens["cached_prompt"], j.tokens["prefill"]))
        rows.append([j.job or "(no job)", f"{j.weight:g}", cap, *tokens, cached, _pct(j.padding_waste)])
    return ["", "jobs (token shares: docs/shares.md)", *_columns(rows, "  ", right=(1, 3, 4, 5, 6, 7))]


# -- running --------------------------------------------------------------------------------------


def _emit(rep: StatusReport, as_json: bool, clear: bool) -> None:
    if as_json:
        text = json.dumps(rep.as_json(), separators=(",", ":"))
    else:
        text = render_text(rep, shutil.get_terminal_size((80, 24)).columns)
        if clear:
            text = "\x1b[H\x1b[2J" + text
    print(text, flush=True)


def _emit_away(conf: dict[str, str], exc: BaseException, away_s: float, as_json: bool, clear: bool) -> None:
    """``--watch`` while Kafka does not answer: one line (one JSON object) per refresh, not an exit."""
    where = conf.get("bootstrap.servers", "?")
    said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    if as_json:
        text = json.dumps({"broker_reachable": False, "bootstrap": where, "unreachable_s": round(away_s, 1),
                           "error": said}, separators=(",", ":"))  # fmt: skip
    else:
        text = f"KAFKA UNREACHABLE at {where} for {away_s:.0f} s ({said}); retrying"
        if clear:
            text = "\x1b[H\x1b[2J" + text
    print(text, flush=True)


def _quietly(_sig: signal.Signals) -> None:
    """``--watch`` needs no word on a stop: the refresh under way is its last."""


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.kafka.config import ConfigError

    if args.schema:
        print(SCHEMA_PATH.read_text(), end="")
        return 0
    try:
        for flag, value in (("--interval-s", args.interval_s), ("--stale-s", args.stale_s)):
            if not value > 0:
                raise ConfigError(f"{flag} must be > 0, got {value:g}")
        conf, topics = _settings_watched(args) if args.watch else kafka_settings(args, pipeline=True)
    except ConfigError as exc:
        print(f"tokenfabric status: error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.forget_processor or args.retire_consumer:
            return _retire(args, conf, topics)
        return _show(args, conf, topics)
    except KafkaException as exc:
        print(f"tokenfabric status: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # the reader went away (``| head``): nothing more to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


#: A ``--watch`` refresh that has not returned this long is said, while it waits, as Kafka unreachable.
SILENT_S = 5.0


def _gather_watched(
    conf: dict[str, str], topics: TopicNames, args: argparse.Namespace, stop: threading.Event, clear: bool
) -> StatusView | None:
    """``gather`` for ``--watch``: a broker that hangs (frozen, a dead network) makes the read wait
    for its timeouts; meanwhile each ``--interval-s`` past :data:`SILENT_S` says Kafka does not
    answer. None when stopped first; raises what the read raised."""
    done: list[StatusView] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            done.append(gather(conf, topics, args.group, groups=True))
        except Exception as exc:  # handed to the watching thread, which raises it
            failed.append(exc)

    reader = threading.Thread(target=read, name="status-read", daemon=True)
    started = time.monotonic()
    reader.start()
    reader.join(SILENT_S)
    while reader.is_alive() and not stop.is_set():
        quiet = TimeoutError(f"no answer for {time.monotonic() - started:.0f} s")
        _emit_away(conf, quiet, time.monotonic() - started, args.json, clear)
        reader.join(args.interval_s)
    if failed:
        raise failed[0]
    return done[0] if done else None


def _settings_watched(args: argparse.Namespace) -> tuple[dict[str, str], TopicNames]:
    """``--watch`` started while Kafka does not answer: say so each ``--interval-s`` until it does."""
    from processor.kafka.reach import BrokerUnreachable

    away_since = time.monotonic()
    while True:
        try:
            return kafka_settings(args, pipeline=True)
        except BrokerUnreachable as exc:
            if type(exc) is not BrokerUnreachable:
                raise  # refused: waiting does not cure it
            conf = {"bootstrap.servers": args.bootstrap or "?"}
            _emit_away(conf, exc, time.monotonic() - away_since, args.json, False)
            time.sleep(args.interval_s)


def _retire(args: argparse.Namespace, conf: dict[str, str], topics: TopicNames) -> int:
    """``--forget-processor`` or ``--retire-consumer``: 1 when it is still alive or unknown."""
    from processor.ops.retire import StillAlive, forget_processor, retire_consumer

    try:
        if args.forget_processor:
            forget_processor(conf, topics, args.forget_processor, args.stale_s)
            print(f"processor {args.forget_processor} forgotten: its counters stay, status omits it")
        else:
            retire_consumer(conf, topics, args.retire_consumer, args.stale_s)
            print(f"consumer {args.retire_consumer} retired: tombstone on {topics.contracts}")
    except (KeyError, StillAlive) as exc:
        print(f"tokenfabric status: {exc.args[0]}", file=sys.stderr)
        return 1
    return 0


def _show(args: argparse.Namespace, conf: dict[str, str], topics: TopicNames) -> int:
    """One status, or (``--watch``) one every ``--interval-s``, with the rates since the last."""
    previous = None
    clear = args.watch and not args.json and sys.stdout.isatty()
    stop = threading.Event()
    if args.watch:
        install_stop_handlers(stop, announce=_quietly)
    away_since: float | None = None
    while not stop.is_set():
        try:
            if args.watch:
                view = _gather_watched(conf, topics, args, stop, clear)
                if view is None:
                    break
            else:
                view = gather(conf, topics, args.group, groups=True)
        except Exception as exc:
            if not args.watch or not is_outage(exc):
                raise
            away_since = away_since or time.monotonic()
            _emit_away(conf, exc, time.monotonic() - away_since, args.json, clear)
            previous = None  # no rates across the gap
            stop.wait(args.interval_s)
            continue
        away_since = None
        rep = with_rates(report(view, topics, args.stale_s), previous)
        _emit(rep, args.json, clear)
        if not args.watch:
            return 0
        previous = rep
        if not clear and not args.json:
            print(flush=True)  # one blank line between refreshes in a pipe or a log
        stop.wait(args.interval_s)
    return 0
