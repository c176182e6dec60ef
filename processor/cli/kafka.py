"""``tokenfabric kafka start|stop|status|jars``: the local broker of :mod:`processor.local.broker`;
``tokenfabric kafka consumer-groups|transactions ...``: Kafka's own tools, from the same jars.

Everything after ``kafka`` goes to :func:`main` untouched (its ``--help`` included); ``main`` is also
what tests and ``python -m processor kafka`` call. The tools are a thin pass-through: every argument
after the tool's name goes to Kafka's ``ConsumerGroupCommand`` / ``TransactionsCommand`` as
``kafka-consumer-groups.sh`` / ``kafka-transactions.sh`` would pass it (``--bootstrap-server``,
``--command-config`` with Java client properties: a secured local broker writes them,
docs/kafka-local.md), and its exit code is the command's.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from pathlib import Path

from processor.cli.logs import setup_logging
from processor.local.broker import (
    HOST,
    BrokerInfo,
    broker_status,
    default_state_dir,
    java_executable,
    restart_broker,
    start_broker,
    stop_broker,
)
from processor.local.jars import KAFKA_VERSION, TOOLS, KafkaLocalError, jars_dir, tool_command
from processor.local.secure import LISTENERS

log = logging.getLogger(__name__)


ACTIONS = ("start", "stop", "restart", "status", "jars", *TOOLS)


def _port(text: str) -> int:
    """A TCP port, 1-65535: refused by argparse, before a JVM starts to fail on it."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir",
        default=None,
        help="broker state: data, logs, broker.json "
        "(default: $TOKENFABRIC_HOME/kafka or ~/.cache/tokenfabric/run/kafka)",
    )
    p.add_argument(
        "kafka_args",
        nargs=argparse.REMAINDER,
        metavar="ACTION ...",
        help=f"one of {', '.join(ACTIONS)}, then its options ('start --help' lists them)",
    )


def run(args: argparse.Namespace) -> int:
    argv: list[str] = list(args.kafka_args)
    if not argv or argv[0] not in (*ACTIONS, "-h", "--help"):
        got = f"unknown action {argv[0]!r}" if argv else "no action"
        print(
            f"tokenfabric kafka: error: {got} (use one of {', '.join(ACTIONS)}; "
            "see 'tokenfabric kafka --help')",
            file=sys.stderr,
        )
        return 2
    if args.state_dir is not None:
        argv = ["--state-dir", args.state_dir, *argv]
    return main(argv)


def _print_info(info: BrokerInfo) -> None:
    print(f"bootstrap={info.bootstrap}")
    print(f"pid={info.pid}")
    print(f"data_dir={info.data_dir}")
    print(f"log_dir={info.log_dir}")
    for listener, bootstrap in info.listeners.items():
        print(f"listener.{listener}={bootstrap}")
    if info.listeners:
        print(f"security_dir={info.data_dir.parent / 'security'}")


def build_parser() -> argparse.ArgumentParser:
    """The parser of everything after ``tokenfabric kafka``."""
    from processor.cli.tokenfabric import OneLineParser

    parser = OneLineParser(
        prog="tokenfabric kafka",
        description=f"A local single-node Apache Kafka {KAFKA_VERSION} broker (KRaft) on {HOST}.",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None,
        help=f"broker state: data, logs, broker.json (default: {default_state_dir()})",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a broker unless one is running; print bootstrap=...")
    start.add_argument("--port", type=_port, default=None, help="client port (default: a free one)")
    start.add_argument("--heap-mb", type=int, default=768, help="JVM max heap in MiB (default: 768)")
    start.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for readiness (default: 120)"
    )
    start.add_argument(
        "--secure",
        action="store_true",
        help=f"TLS, mutual TLS and SCRAM-SHA-512 listeners ({', '.join(LISTENERS)}), a throwaway CA, "
        "and an authorizer that denies what no ACL allows (docs/kafka-local.md)",
    )
    start.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="NAME",
        help="with --secure: a user with a SCRAM password and a client certificate (repeatable); "
        "their client settings are written under the state dir's security/",
    )
    for tool, main_class in TOOLS.items():
        sub.add_parser(
            tool, help=f"run Kafka's {main_class.rsplit('.', 1)[1]} with the arguments that follow"
        )
    sub.add_parser("stop", help="stop the broker (exit 0 also when none runs)")
    restart = sub.add_parser(
        "restart", help="stop the broker and start it again on the same port, its topics and data kept"
    )
    restart.add_argument("--heap-mb", type=int, default=768, help="JVM max heap in MiB (default: 768)")
    restart.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for readiness (default: 120)"
    )
    sub.add_parser("status", help="print the running broker (exit 1 when none runs)")
    sub.add_parser("jars", help="resolve the jars and print their folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``start|stop|status`` a local broker; ``start`` prints ``bootstrap=HOST:PORT`` first."""
    argv = sys.argv[1:] if argv is None else argv
    tool = _tool_call(argv)
    if tool is not None:
        return _run_tool(*tool)
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:  # called directly, not through tokenfabric.main
        setup_logging("INFO", "text")
    state_dir: Path = args.state_dir or default_state_dir()
    try:
        if args.command != "jars":
            _check_state_dir(state_dir, create=args.command == "start")
        return _run_command(args, state_dir)
    except KafkaLocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the state dir cannot be made or written: a path under a file, no rights
        where = exc.filename or state_dir
        print(
            f"tokenfabric kafka: error: --state-dir {state_dir}: {where}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1


def _tool_call(argv: list[str]) -> tuple[str, list[str]] | None:
    """(tool, its arguments) when ``argv`` names one of Kafka's tools (after an optional
    ``--state-dir``, which the tools do not use), else None."""
    rest = argv[2:] if argv[:1] == ["--state-dir"] else argv
    if rest and rest[0] in TOOLS:
        return rest[0], rest[1:]
    return None


def _run_tool(tool: str, args: list[str]) -> int:
    """Run Kafka's ``tool`` in the foreground, stdin and output shared; its exit code is ours."""
    import subprocess

    try:
        command = tool_command(java_executable(), tool, args)
    except KafkaLocalError as exc:
        print(f"tokenfabric kafka {tool}: error: {exc}", file=sys.stderr)
        return 1
    asked_help = args in (["--help"], ["-h"])
    if asked_help:
        print(
            f"usage: tokenfabric kafka {tool} [ARGS...]: Kafka's own tool, from the local broker's jars; "
            "its options:"
        )
        sys.stdout.flush()
    code = subprocess.run(command, check=False).returncode
    return 0 if asked_help and code == 1 else code  # Kafka's tools exit 1 after the usage asked for


def _check_state_dir(state_dir: Path, *, create: bool) -> None:
    """Raise OSError, naming the path, when the state dir is not a usable folder; ``create`` makes it
    (``start``), so an unwritable place fails here in one line rather than deep inside the start-up."""
    existing = next((p for p in (state_dir, *state_dir.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise OSError(errno.ENOTDIR, "not a folder", str(existing))
    if create:
        state_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(state_dir, os.W_OK | os.X_OK):
            raise OSError(errno.EACCES, "not writable", str(state_dir))


def _run_command(args: argparse.Namespace, state_dir: Path) -> int:
    if args.command == "start":
        info = broker_status(state_dir)
        if args.user and not args.secure:
            print("tokenfabric kafka start: error: --user needs --secure", file=sys.stderr)
            return 2
        if info is None:
            info = start_broker(
                state_dir,
                port=args.port,
                heap_mb=args.heap_mb,
                timeout_s=args.timeout,
                secure_users=args.user if args.secure else None,
            )
        else:
            log.info("already running (pid %d)", info.pid)
        _print_info(info)
        return 0
    if args.command == "stop":
        print("stopped" if stop_broker(state_dir) else "not running")
        return 0
    if args.command == "restart":
        _print_info(restart_broker(state_dir, heap_mb=args.heap_mb, timeout_s=args.timeout))
        return 0
    if args.command == "status":
        info = broker_status(state_dir)
        if info is None:
            print("not running")
            return 1
        _print_info(info)
        return 0
    if args.command == "jars":
        print(jars_dir())
        return 0
    raise AssertionError(args.command)
