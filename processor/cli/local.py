"""``tokenfabric local up|down|status``: a whole local stack for trying jobs, in one command.

``up`` starts (or reuses) the local broker, creates one pipeline's topics, and runs a processor and
``--consumers N`` consumers in the background, their logs in one folder; it returns once every
consumer has announced its contract, so a ``submit`` right after it is served. ``down`` stops exactly
what ``up`` started (processor/local/stack.py says how), ``status`` lists it.

``down`` refuses (exit 1, one line) while stopping would discard work: when ``up`` started the
broker, stopping it discards every topic (the next ``up`` formats a fresh one), so jobs whose
results ``collect`` has not written yet would be lost without a word. It names them and the two
ways on: collect them first, or ``local down --discard``. Why not keep them across a ``down``: a
stack that is down makes no progress, and the broker ``up`` starts is a throwaway one for trying
jobs (docs/jobs.md); keeping its data would need a broker that outlives the stack, which
``tokenfabric kafka start`` already is (``down`` never stops a broker ``up`` did not start).

Exit status: 0 done; 1 a part failed to start (everything started is stopped again) or to stop, or
``down`` refused to discard uncollected jobs; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from processor.cli.options import engine_opt
from processor.kafka.topics import DEFAULT_PREFIX
from processor.sim.columns import folded

if TYPE_CHECKING:
    from processor.local.stack import Stack

PROG = "tokenfabric local"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status"], help="start, stop or list the local stack")
    p.add_argument("--consumers", type=int, default=2, help="with up: consumers to run (default: 2)")
    p.add_argument(
        "--engine",
        choices=["sim", "embed", "openai"],
        default="sim",
        help="with up: the consumers' engine (default: sim, a modelled card that needs nothing else)",
    )
    p.add_argument(
        "--engine-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with up: an engine option for every consumer (repeatable), e.g. url=http://127.0.0.1:8080",
    )
    p.add_argument(
        "--model", default="default", help="with up: the model the consumers serve (default: default)"
    )
    p.add_argument(
        "--topic-prefix",
        default="tokenfabric",
        help="with up: the pipeline's topic prefix (default: tokenfabric)",
    )
    p.add_argument("--ingest-partitions", type=int, default=3, help="with up: ingest partitions (default: 3)")
    p.add_argument(
        "--bootstrap",
        default=None,
        metavar="HOST:PORT",
        help="with up: use this cluster instead of the local broker (then never started or stopped here)",
    )
    p.add_argument(
        "--state-dir", type=Path, default=None, help="the stack's folder (default: beside the broker's)"
    )
    p.add_argument(
        "--discard",
        action="store_true",
        help="with down: stop even if the broker holds jobs whose results were not collected",
    )
    _add_registry_flag(p)


def _add_registry_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry", action="store_true",
        help="with up: also a local schema registry (tokenfabric registry), the schemas registered in it, "
        "and the processor reading registry-framed items through it",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from processor.local.broker import default_state_dir
    from processor.local.stack import default_stack_dir

    state_dir = (args.state_dir or default_stack_dir()).resolve()
    broker_dir = default_state_dir()
    if args.action == "down":
        return _down(state_dir, broker_dir, args.discard)
    if args.action == "status":
        return _status(state_dir, broker_dir)
    return _up(args, state_dir, broker_dir)


def _down(state_dir: Path, broker_dir: Path, discard: bool) -> int:
    from confluent_kafka import KafkaException

    from processor.local.jars import KafkaLocalError
    from processor.local.stack import Stack, stack_down, uncollected_jobs

    try:
        stack = Stack.load(state_dir)
        held = [] if discard or stack is None else uncollected_jobs(stack, broker_dir)
        if held:
            print(f"{PROG}: error: {_discard_warning(held, stack)}", file=sys.stderr)
            return 1
        stopped = stack_down(state_dir, broker_dir)
    except KafkaException as exc:
        print(f"{PROG}: error: cannot read the jobs on the stack's broker ({exc}); "
              "'tokenfabric local down --discard' stops it anyway", file=sys.stderr)  # fmt: skip
        return 1
    except KafkaLocalError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(f"stopped: {', '.join(stopped)}" if stopped else "no local stack was up")
    return 0


def _discard_warning(held: list[str], stack: Stack | None) -> str:
    """One line: which jobs stopping the broker would lose, and the two ways on."""
    named = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
    prefix = f" --topic-prefix {stack.prefix}" if stack and stack.prefix != DEFAULT_PREFIX else ""
    return (
        f"stopping the broker 'up' started discards every job on it, and {len(held)} have results not "
        f"yet collected ({named}): 'tokenfabric collect --job NAME --out FILE{prefix}' first, or "
        "'tokenfabric local down --discard'"
    )


def _status(state_dir: Path, broker_dir: Path) -> int:
    from processor.local.broker import broker_status
    from processor.local.jars import KafkaLocalError
    from processor.local.stack import Stack

    try:
        stack = Stack.load(state_dir)
    except KafkaLocalError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    if stack is None:
        print("no local stack is up ('tokenfabric local up' starts one)")
        return 0
    print(f"prefix {stack.prefix}  model {stack.model}  bootstrap {stack.bootstrap}")
    print(f"logs {stack.log_dir}")
    broker = broker_status(broker_dir)
    if stack.started_broker or (broker is not None and broker.bootstrap == stack.bootstrap):
        state = f"up    pid {broker.pid}" if broker is not None else "DOWN"
        whose = "started by up; down stops it" if stack.started_broker else "was running; down leaves it"
        print(f"  {'kafka':<10} {state}  ({whose})")
    for p in stack.processes:
        print(f"  {p.name:<10} {'up  ' if p.alive() else 'DOWN'}  pid {p.pid}")
    return 0


def _up(args: argparse.Namespace, state_dir: Path, broker_dir: Path) -> int:
    from processor.local.jars import KafkaLocalError
    from processor.local.stack import StackSettings, stack_up

    try:
        for pair in args.engine_opt:
            engine_opt(pair)
        settings = StackSettings(
            consumers=args.consumers,
            engine=args.engine,
            engine_opts=tuple(args.engine_opt),
            model=args.model,
            prefix=args.topic_prefix,
            ingest_partitions=args.ingest_partitions,
            registry=args.registry,
        )
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        stack = stack_up(settings, state_dir, broker_dir, args.bootstrap, on_step=print)
    except (KafkaLocalError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted: everything started was stopped again", file=sys.stderr)
        return 130
    # only the flags the other commands need: with neither, they find the local broker and the
    # default prefix by themselves
    kafka = "".join(
        [
            f" --bootstrap {stack.bootstrap}" if args.bootstrap else "",
            f" --topic-prefix {stack.prefix}" if stack.prefix != DEFAULT_PREFIX else "",
        ]
    )
    up = f"up: bootstrap={stack.bootstrap} prefix={stack.prefix} model={stack.model} logs={stack.log_dir}"
    print(folded(up, shutil.get_terminal_size((80, 24)).columns))
    if stack.registry_url:
        print(f"registry: url={stack.registry_url} (subject {stack.prefix}.ingest-value)")
    print(f"next: tokenfabric submit DATASET --job NAME --template FILE{kafka}")
    print(f"      tokenfabric collect --job NAME --out OUT.jsonl --wait{kafka}")
    print("      tokenfabric local down")
    return 0
