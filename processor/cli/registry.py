"""``tokenfabric registry build|start|stop|status``: the local Schema Registry of
:mod:`processor.local.registry` (Apicurio Registry, Confluent-compatible API) on loopback.

``start`` builds the registry first if the cache lacks it (about a minute, once per machine), then
prints ``url=`` (the Confluent-compatible base URL a registry client takes) and ``pid=``, as
``kafka start`` prints ``bootstrap=``. Progress goes to stderr, the ``key=value`` lines to stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from processor.local.registry import (
    RegistryInfo,
    RegistryLocalError,
    build_registry,
    default_state_dir,
    registry_home,
    registry_status,
    start_registry,
    stop_registry,
)


def configure(p: argparse.ArgumentParser) -> None:
    from processor.cli.tokenfabric import OneLineParser

    p.add_argument(
        "--state-dir", type=Path, default=None,
        help=f"the registry's log and registry.json (default: {default_state_dir()})",
    )  # fmt: skip
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=OneLineParser)
    sub.add_parser("build", help="build the registry into the cache unless built; print its jar")
    start = sub.add_parser("start", help="start a registry unless one runs; print url=... and pid=...")
    start.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
    start.add_argument("--heap-mb", type=int, default=192, help="JVM max heap in MiB (default: 192)")
    start.add_argument(
        "--timeout-s", type=float, default=120.0, help="seconds to wait for it to answer (default: 120)"
    )
    sub.add_parser("stop", help="stop the registry (exit 0 also when none runs)")
    sub.add_parser("status", help="print the running registry (exit 1 when none runs)")


def build_parser() -> argparse.ArgumentParser:
    from processor.cli.tokenfabric import OneLineParser

    parser = OneLineParser(
        prog="tokenfabric registry", description="A local Confluent-compatible schema registry."
    )
    configure(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    try:
        return _run_action(args, state_dir)
    except RegistryLocalError as exc:
        print(f"tokenfabric registry {args.action}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the cache or state folder cannot be written
        print(f"tokenfabric registry {args.action}: error: {exc.filename or ''}: {exc.strerror or exc}",
              file=sys.stderr)  # fmt: skip
        return 1


def _run_action(args: argparse.Namespace, state_dir: Path) -> int:
    if args.action == "build":
        started = time.monotonic()
        jar = build_registry()
        print(f"jar={jar}")
        print(f"home={registry_home()}")
        print(f"took_s={time.monotonic() - started:.0f}")
        return 0
    if args.action == "start":
        info = registry_status(state_dir)
        if info is None:
            info = start_registry(state_dir, port=args.port, heap_mb=args.heap_mb, timeout_s=args.timeout_s)
        else:
            print(f"a registry is already running (pid {info.pid})", file=sys.stderr)
        _print_info(info)
        return 0
    if args.action == "stop":
        print("stopped" if stop_registry(state_dir) else "not running")
        return 0
    info = registry_status(state_dir)
    if info is None:
        print("not running")
        return 1
    _print_info(info)
    return 0


def _print_info(info: RegistryInfo) -> None:
    print(f"url={info.url}")
    print(f"pid={info.pid}")
    print(f"log={info.log_file}")
