"""``tokenfabric``: one console script, one module per subcommand.

Each subcommand module exposes ``configure(parser)`` and ``run(args) -> int`` and is imported only when
its command runs, so ``tokenfabric simulate`` never loads Kafka and a missing optional dependency
only breaks the command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("processor.cli.simulate", "replay a trace through the scheduler in virtual time"),
    "kafka": ("processor.cli.kafka", "start, stop, restart or inspect a local single-node Kafka broker"),
    "llm": ("processor.cli.llm", "build, start, stop or inspect local llama-server generation servers"),
    "registry": (
        "processor.cli.registry",
        "build, start, stop or inspect a local Confluent-compatible schema registry",
    ),
    "local": ("processor.cli.local", "start, stop or list a whole local stack: broker, processor, consumers"),
    "topics": ("processor.cli.topics", "create tokenfabric's topics"),
    "schemas": ("processor.cli.schemas", "register tokenfabric's Avro schemas in a Schema Registry"),
    "produce": ("processor.cli.produce", "replay a trace onto the ingest topic"),
    "processor": ("processor.cli.processor", "run the stream processor"),
    "consumer": ("processor.cli.consumer", "run a GPU consumer app with an engine"),
    "status": ("processor.cli.status", "print contracts, accounting and lag"),
    "audit": ("processor.cli.audit", "re-derive the ledger from the topics; exit 1 on a difference"),
    "demo": ("processor.cli.demo", "run the whole pipeline on a real trace and print a report"),
    "plain-queue": (
        "processor.cli.plainqueue",
        "one card of the plain Kafka queue baseline the demo compares with (not a product mode)",
    ),
    "share-queue": (
        "processor.cli.sharequeue",
        "one card of the share-group queue baseline the demo compares with (not a product mode)",
    ),
    "submit": ("processor.cli.submit", "submit a dataset as a job: render, tokenise and produce every row"),
    "collect": ("processor.cli.collect", "write a job's results next to its input rows (resumable)"),
    "collector": (
        "processor.cli.collector",
        "collect every job on the jobs topic into a folder, continuously",
    ),
    "jobs": ("processor.cli.jobs", "list jobs and their progress"),
    "share": ("processor.cli.share", "show or change a job's token share: its weight and quotas"),
    "cancel": (
        "processor.cli.cancel",
        "cancel a job: its waiting items never go out, batches in flight finish",
    ),
    "acls": ("processor.cli.acls", "print or create the Kafka ACLs each role of a pipeline needs"),
}


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments get one line: what is wrong and where to look, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser(command: str | None = None) -> OneLineParser:
    from processor import __version__

    parser = OneLineParser(prog="tokenfabric", description="Schedule LLM inference work by the token.")
    parser.add_argument("--version", action="version", version=f"tokenfabric {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, (module, help_text) in COMMANDS.items():
        sub = subs.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).configure(sub)
    return parser


def default_logging(command: str) -> None:
    """Every command logs in the one format of processor/cli/logs.py: warnings and errors (the local
    broker's progress too, for ``kafka``) unless its own ``--log-level`` / ``--log-format`` say
    otherwise. Left alone when the root logger already has a handler (an embedding program, pytest)."""
    import logging

    from processor.cli.logs import setup_logging

    if not logging.getLogger().handlers:
        setup_logging("INFO" if command == "kafka" else "WARNING", "text")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and command not in COMMANDS:
        known = ", ".join(COMMANDS)
        print(f"tokenfabric: error: unknown command {command!r} (commands: {known})", file=sys.stderr)
        return 2
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    default_logging(args.command)
    from processor.kafka.reach import BrokerUnreachable

    try:
        return int(module.run(args))
    except BrokerUnreachable as exc:  # or refused: a TLS, SASL or authorizer refusal (processor.kafka.reach)
        print(f"tokenfabric {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of our output went away (``tokenfabric jobs | head``): nothing more to say to it.

    stdout is pointed at /dev/null so that the interpreter's final flush does not raise again, and
    the exit status is the shell's for a command ended by SIGPIPE (128 + 13), without a traceback.
    """
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


if __name__ == "__main__":
    sys.exit(main())
