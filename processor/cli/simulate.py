"""``tokenfabric simulate``: compare scheduling policies, and batching modes, on a trace without Kafka or
GPUs."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from processor.cli.options import (
    add_lane_arguments,
    add_share_arguments,
    add_trace_reading_arguments,
    check_plot,
    lanes_from,
    shares_from,
)
from processor.core.contract import BATCHING_MODES
from processor.sim.report import render_table
from processor.sim.simulator import DEFAULT_CONSUMERS, POLICIES, ConsumerSpec, parse_consumer_spec, simulate
from processor.sim.traces import FORMATS, SHIPPED, TraceError, TraceRecord, read_trace, shipped_trace


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace", required=True, help=f"trace file (.gz accepted), or a shipped trace: {', '.join(SHIPPED)}"
    )
    p.add_argument("--format", default="jsonl", choices=FORMATS, help="trace format (default: jsonl)")
    add_trace_reading_arguments(p)
    p.add_argument("--backlog", action="store_true", help="every item present at t=0 (an offline backlog)")
    p.add_argument("--speed", type=float, default=1.0, help="replay arrivals X times faster (default: 1)")
    p.add_argument(
        "--consumer",
        action="append",
        default=[],
        metavar="SPEC",
        help="NAME:model=M,budget=16384,items=64,pad=8,inflight=2,tps=50000,overhead_ms=5,cache=4 "
        "(also batching=, memory_bytes=, kv_bytes_per_token=, default_output_tokens=; "
        "repeatable; default: a 16 GB and a 32 GB card)",
    )
    b = p.add_argument_group("batching modes (docs/consumer-contract.md); a --consumer key overrides these")
    b.add_argument(
        "--batching",
        help=f"batch every consumer by one of {', '.join(BATCHING_MODES)}, a comma list (one column each) "
        "or 'all' (default: each consumer's own, tokens)",
    )
    b.add_argument("--memory-bytes", type=int, help="KV-cache bytes one batch may fill (memory batching)")
    b.add_argument(
        "--kv-bytes-per-token",
        type=int,
        help="KV-cache bytes per token; with --memory-bytes, every mode reports KV peak and overflow",
    )
    b.add_argument(
        "--default-output-tokens",
        type=int,
        help="output tokens counted for an item whose trace has no output length (default: 0)",
    )
    p.add_argument(
        "--policy",
        default="lanes",
        help=f"one of {', '.join(POLICIES)}, a comma list, or 'all' (default: lanes)",
    )
    p.add_argument(
        "--window", type=int, default=1024, help="sorted-window: items sorted at once (default: 1024)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for engine-time jitter (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument(
        "--emit-batches", metavar="FILE", help="write one JSON line per batch (single policy only)"
    )
    p.add_argument("--plot", metavar="FILE.png", help="write a PNG chart comparing the policies")
    add_lane_arguments(p)
    add_share_arguments(p)


def run(args: argparse.Namespace) -> int:
    prog = "tokenfabric simulate"
    try:
        policies, runs = _plan(args)
        lanes, dispatch = lanes_from(args)
        shares = shares_from(args)
        trace, records = _read(args)
        with _open_or_none(args.emit_batches) as emit:
            reports = [
                simulate(
                    records,
                    consumers,
                    policy,
                    backlog=args.backlog,
                    speed=args.speed,
                    lanes=lanes,
                    dispatch=dispatch,
                    window=args.window,
                    seed=args.seed,
                    emit=emit,
                    batching=mode,
                    shares=shares,
                )
                for mode, consumers in runs
                for policy in policies
            ]
    except (TraceError, ValueError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = reports[0].to_dict() if len(reports) == 1 else {r.label: r.to_dict() for r in reports}
        print(json.dumps(out, indent=2))
    else:
        print(render_table(reports, shutil.get_terminal_size((120, 24)).columns))
    if args.plot:
        from processor.sim.plots import plot_simulation

        try:
            plot_simulation(reports, args.plot, trace.name)
        except (ValueError, OSError) as exc:  # the folder went away or is not writable
            print(f"{prog}: error: --plot {args.plot}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _plan(args: argparse.Namespace) -> tuple[list[str], list[tuple[str | None, list[ConsumerSpec]]]]:
    """The policies, and each batching mode with its consumers; ValueError for a combination the
    outputs cannot take (one file of batches, one chart) or memory batching without its numbers."""
    policies = _policies(args.policy)
    modes = _modes(args.batching)
    if args.emit_batches and len(policies) * len(modes) > 1:
        raise ValueError("--emit-batches needs a single --policy and --batching mode")
    if args.plot and len(modes) > 1:
        raise ValueError("--plot compares policies: give a single --batching mode")
    if args.plot:
        check_plot(args.plot)
    if "memory" in modes and not args.consumer:
        missing = [f"--{n.replace('_', '-')}" for n in MEMORY_NUMBERS[:2] if getattr(args, n) is None]
        if missing:
            raise ValueError(f"--batching memory needs {' and '.join(missing)}")
    numbers = {n: getattr(args, n) for n in MEMORY_NUMBERS if getattr(args, n) is not None}
    specs = args.consumer or DEFAULT_CONSUMERS
    return policies, [
        (mode, [parse_consumer_spec(s, {**numbers, **_mode(mode)}) for s in specs]) for mode in modes
    ]


def _read(args: argparse.Namespace) -> tuple[Path, list[TraceRecord]]:
    """The trace's path and its records (a shipped trace by name is read in its own format)."""
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.shape_blocks < 0:
        raise ValueError(f"--shape-blocks must be >= 0, got {args.shape_blocks}")
    trace, fmt = Path(args.trace), args.format
    if not trace.exists() and args.trace in SHIPPED:  # a shipped trace by name: its own format
        trace, fmt = shipped_trace(args.trace), SHIPPED[args.trace][1]
    records = read_trace(
        trace, fmt, shape_blocks=args.shape_blocks, default_model=args.model, limit=args.limit
    )
    return trace, records


MEMORY_NUMBERS = ("memory_bytes", "kv_bytes_per_token", "default_output_tokens")


def _modes(text: str | None) -> list[str | None]:
    """``--batching``: None (each consumer's own mode) when absent, else the modes to run, in order."""
    if text is None:
        return [None]
    names = list(BATCHING_MODES) if text == "all" else [m.strip() for m in text.split(",") if m.strip()]
    for name in names:
        if name not in BATCHING_MODES:
            raise ValueError(f"--batching {name!r}: choose from {', '.join(BATCHING_MODES)} or 'all'")
    if not names:
        raise ValueError("--batching is empty")
    return list(dict.fromkeys(names))


def _mode(mode: str | None) -> dict[str, str]:
    return {} if mode is None else {"batching": mode}


def _policies(text: str) -> list[str]:
    names = list(POLICIES) if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
    for name in names:
        if name not in POLICIES:
            raise ValueError(f"--policy {name!r}: choose from {', '.join(POLICIES)} or 'all'")
    if not names:
        raise ValueError("--policy is empty")
    return names


@contextlib.contextmanager
def _open_or_none(path: str | None) -> Iterator[IO[str] | None]:
    if path is None:
        yield None
        return
    with open(path, "w", encoding="utf-8") as fh:
        out: IO[str] = fh
        yield out
