"""``tokenfabric llm build|start|stop|status``: named llama-server instances of
:mod:`processor.local.llm`, a real OpenAI-compatible generation server on this machine.

``start`` builds llama-server and writes the model first if the cache lacks them (minutes, once per
machine), then prints ``url=http://127.0.0.1:PORT`` first, as ``kafka start`` prints ``bootstrap=``.
Progress goes to stderr, the ``key=value`` lines to stdout. ``main`` is what tests call.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from processor.local.llm.build import build_server, default_jobs
from processor.local.llm.errors import LlmLocalError
from processor.local.llm.model import ensure_model
from processor.local.llm.server import (
    DEFAULT_NAME,
    ServerInfo,
    ServerSettings,
    running_servers,
    server_status,
    start_server,
    stop_server,
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


_DEFAULTS = ServerSettings()

_SETTING_OPTIONS: tuple[tuple[str, str, Callable[[str], object], str], ...] = (
    ("--slots", "slots", _positive_int, "-np: requests decoded at once"),
    ("--ctx-tokens", "ctx_tokens", _positive_int,
     "-c: KV-cache positions in all, split evenly between the slots"),
    ("--threads", "threads", _positive_int, "-t/-tb: CPU threads"),
    ("--cache-reuse-tokens", "cache_reuse_tokens", int,
     "--cache-reuse: smallest chunk reused by KV shifting; 0 = common prefix only"),
    ("--cache-ram-mib", "cache_ram_mib", int,
     "--cache-ram: host-memory prompt store in MiB, -1 = no limit, 0 = off"),
    ("--slot-similarity", "slot_similarity", float,
     "-sps: share of a prompt a slot's cache must match to be preferred"),
)  # fmt: skip
"""``start``'s options that are :class:`ServerSettings` fields: (flag, field, parser, help)."""


def _port(text: str) -> int:
    port = _positive_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def configure(p: argparse.ArgumentParser) -> None:
    from processor.cli.tokenfabric import OneLineParser

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=OneLineParser)
    build = sub.add_parser("build", help="build llama-server and write the model unless cached; print paths")
    build.add_argument(
        "--jobs", type=_positive_int, default=default_jobs(),
        help="parallel compilers (default: one per CPU, %(default)s here)",
    )  # fmt: skip
    start = sub.add_parser("start", help="start a server unless that name runs; print url=...")
    _add_name(start)
    start.add_argument("--port", type=_port, default=None, help="HTTP port (default: a free one)")
    for flag, field, kind, help_text in _SETTING_OPTIONS:
        start.add_argument(
            flag, dest=field, type=kind, default=getattr(_DEFAULTS, field),
            help=f"{help_text} (default: %(default)s)",
        )  # fmt: skip
    start.add_argument(
        "--no-cache-prompt", action="store_true",
        help="turn off the slots' prompt cache (default: on: a slot reuses its last prompt's prefix)",
    )  # fmt: skip
    start.add_argument(
        "--lora", metavar="FILE", action="append", default=[],
        help="a LoRA adapter GGUF to load (repeatable; ids from 0 in order: the openai engine's lora_ids)",
    )  # fmt: skip
    start.add_argument(
        "--timeout-s", type=float, default=120.0,
        help="seconds to wait for /health after the launch (default: %(default)s)",
    )  # fmt: skip
    stop = sub.add_parser("stop", help="stop a server (exit 0 also when none runs)")
    _add_name(stop)
    status = sub.add_parser("status", help="print running servers (exit 1 when none runs)")
    status.add_argument("--name", default=None, help="only this server (default: every running one)")


def _add_name(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--name", default=DEFAULT_NAME,
        help="the server's name: one per card, each with its own state folder (default: %(default)s)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The parser of everything after ``tokenfabric llm``."""
    from processor.cli.tokenfabric import OneLineParser

    parser = OneLineParser(prog="tokenfabric llm", description="A local llama-server (OpenAI-compatible).")
    configure(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        return _run_action(args)
    except LlmLocalError as exc:
        print(f"tokenfabric llm {args.action}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the cache or state folder cannot be written
        print(f"tokenfabric llm {args.action}: error: {exc.filename or ''}: {exc.strerror or exc}",
              file=sys.stderr)  # fmt: skip
        return 1


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run_action(args: argparse.Namespace) -> int:
    if args.action == "build":
        model = ensure_model()  # first: a machine without the llm extra is told before a build
        record = build_server(jobs=args.jobs, progress=_progress)
        print(f"binary={record.binary}")
        print(f"build_s={record.build_s:.0f}")
        print(f"model={model}")
        return 0
    if args.action == "start":
        running = server_status(args.name)
        if running is not None:
            _progress(f"llama-server {args.name!r} is already running (pid {running.pid})")
            _print_info(running)
            return 0
        settings = ServerSettings(
            cache_prompt=not args.no_cache_prompt,
            lora=tuple(str(Path(f).resolve()) for f in args.lora),
            **{field: getattr(args, field) for _, field, _, _ in _SETTING_OPTIONS},
        )
        model = ensure_model()  # first: a machine without the llm extra is told before a build
        binary = build_server(progress=_progress).binary
        info = start_server(
            binary,
            model,
            name=args.name,
            settings=settings,
            port=args.port,
            timeout_s=args.timeout_s,
        )
        _print_info(info)
        return 0
    if args.action == "stop":
        print("stopped" if stop_server(args.name) else "not running")
        return 0
    if args.action == "status":
        servers = running_servers() if args.name is None else [s for s in [server_status(args.name)] if s]
        if not servers:
            print("not running")
            return 1
        for info in servers:
            _print_info(info)
        return 0
    raise AssertionError(args.action)


def _print_info(info: ServerInfo) -> None:
    print(f"url={info.url}")
    print(f"name={info.name}")
    print(f"pid={info.pid}")
    print(f"slots={info.settings.slots}")
    print(f"ctx_tokens_per_slot={info.settings.ctx_tokens_per_slot}")
    print(f"log={info.log_file}")
