"""``tokenfabric kafka start|stop|status|jars``: the local broker of processor.local.broker, as a command.

Everything after ``kafka`` is handed to :func:`processor.local.broker.main` untouched (its ``--help``
included), so the two entry points can never drift apart.
"""

from __future__ import annotations

import argparse
import sys

ACTIONS = ("start", "stop", "status", "jars")


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
    from processor.local.broker import main

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
