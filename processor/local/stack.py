"""A whole local stack in the background: the broker, one pipeline's topics, a processor, N consumers.

``tokenfabric local up`` is what a newcomer runs before ``submit`` and ``collect``: every part is the
production command (``tokenfabric processor``, ``tokenfabric consumer``) as its own detached
process, its output in one log folder. ``local down`` stops exactly what ``up`` started, nothing else:

- the stack file (``stack.json`` in the stack's state folder) records each process's pid and its
  full command line; a pid is signalled only while ``/proc`` shows that same command line, so a pid
  the system has since given to another program is never touched;
- the broker is stopped only if ``up`` started it; one that was already running stays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from processor.apps.schema_registry import RegistryRefused, RegistrySettings, register_schemas
from processor.kafka.topics import TopicNames, create_topics, topic_specs
from processor.local.broker import broker_status, start_broker, stop_broker
from processor.local.jars import KafkaLocalError
from processor.local.pipeline import child_env
from processor.local.processes import process_argv, terminate
from processor.local.registry import default_state_dir as registry_state_dir
from processor.local.registry import registry_status, start_registry, stop_registry
from processor.ops.contracts import announced_contracts, consumers_of
from processor.wire.registry_framing import RegistryUnavailable

STACK_FILE = "stack.json"
#: A consumer's contract in the local stack: small enough for a laptop, the sim engine's defaults.
CONSUMER_BUDGET_TOKENS = 4096
CONSUMER_MAX_ITEMS = 32


class StackError(KafkaLocalError):
    """The local stack cannot be brought up, or its file is unreadable: one line for the user."""


@dataclass(frozen=True, slots=True)
class StackSettings:
    """What ``local up`` starts. ``engine_opts`` are ``KEY=VALUE`` pairs for every consumer."""

    consumers: int = 2
    engine: str = "sim"
    engine_opts: tuple[str, ...] = ()
    model: str = "default"
    prefix: str = "tokenfabric"
    ingest_partitions: int = 3
    registry: bool = False
    """Also a local schema registry (processor/local/registry.py): the schemas registered, the
    processor reading registry-framed items through it."""

    def __post_init__(self) -> None:
        if not 1 <= self.consumers <= 16:
            raise ValueError(f"--consumers must be 1 to 16, got {self.consumers}")
        if self.ingest_partitions < 1:
            raise ValueError(f"--ingest-partitions must be >= 1, got {self.ingest_partitions}")

    def consumer_names(self) -> list[str]:
        return [f"card{n}" for n in range(1, self.consumers + 1)]


@dataclass(frozen=True, slots=True)
class StackProcess:
    """One process ``up`` started: its name (the log file's stem), pid and exact command line."""

    name: str
    pid: int
    argv: list[str]
    log: str

    def alive(self) -> bool:
        """True while the pid runs this very command line (not a later program given the same pid)."""
        return process_argv(self.pid) == self.argv


@dataclass(frozen=True, slots=True)
class Stack:
    """What ``up`` started and where: read back by ``down`` and ``status`` from the stack file."""

    bootstrap: str
    prefix: str
    model: str
    log_dir: str
    started_broker: bool
    processes: list[StackProcess] = field(default_factory=list)
    registry_url: str = ""
    """The schema registry's Confluent-compatible URL ("" without ``--registry``)."""
    started_registry: bool = False

    def save(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / (STACK_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        tmp.replace(state_dir / STACK_FILE)

    @classmethod
    def load(cls, state_dir: Path) -> Stack | None:
        path = state_dir / STACK_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StackError(f"{path} is unreadable ({exc}); remove it once no stack process runs") from None
        procs = [StackProcess(**p) for p in raw.pop("processes")]
        return cls(**raw, processes=procs)


def default_stack_dir() -> Path:
    """``$TOKENFABRIC_HOME/local`` or ``~/.cache/tokenfabric/run/local``, beside the local broker's."""
    env = os.environ.get("TOKENFABRIC_HOME")
    if env:
        return Path(env).expanduser() / "local"
    return Path.home() / ".cache" / "tokenfabric" / "run" / "local"


def stack_up(
    settings: StackSettings,
    state_dir: Path,
    broker_dir: Path,
    bootstrap: str | None = None,
    on_step: Callable[[str], None] = lambda _line: None,
    ready_timeout_s: float = 120.0,
) -> Stack:
    """Start the stack and wait until every consumer has announced its contract.

    ``bootstrap`` names a cluster to use instead of the local broker (which is then neither started
    nor stopped). Refuses while a stack of this state folder still has a live process. If a part
    fails to start, everything started so far is stopped again before the error is raised.
    """
    running = Stack.load(state_dir)
    if running is not None and any(p.alive() for p in running.processes):
        raise StackError(
            f"a local stack is already up (prefix {running.prefix}): 'tokenfabric local down' first"
        )
    started_broker = False
    if bootstrap is None:
        bootstrap, started_broker = _local_broker(broker_dir, on_step)
    log_dir = state_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(bootstrap, settings.prefix, settings.model, str(log_dir), started_broker)
    stack.save(state_dir)  # before any process starts: down can always undo what up began
    try:
        conf = {"bootstrap.servers": bootstrap}
        topics = TopicNames(settings.prefix)
        specs = topic_specs(
            topics, ingest_partitions=settings.ingest_partitions, consumers=settings.consumer_names()
        )
        create_topics(conf, specs)
        on_step(f"topics of prefix {settings.prefix} ready")
        if settings.registry:
            stack = _with_registry(stack, state_dir, topics, on_step)
        _spawn_all(stack, state_dir, settings)
        on_step(f"processor and {settings.consumers} consumers started; waiting for their contracts")
        _wait_announced(stack, settings, conf, topics, ready_timeout_s)
    except BaseException:
        stack_down(state_dir, broker_dir)
        raise
    return stack


def _local_broker(broker_dir: Path, on_step: Callable[[str], None]) -> tuple[str, bool]:
    """The local broker's bootstrap, and whether it was started for this stack (not running yet)."""
    info = broker_status(broker_dir)
    if info is not None:
        return info.bootstrap, False
    on_step("starting the local Kafka broker")
    return start_broker(broker_dir).bootstrap, True


def _with_registry(
    stack: Stack, state_dir: Path, topics: TopicNames, on_step: Callable[[str], None]
) -> Stack:
    """The local schema registry (started unless one runs), with the schemas registered, BACKWARD."""
    registry_dir = registry_state_dir()
    info = registry_status(registry_dir)
    started = info is None
    if info is None:
        on_step("starting the local schema registry")
        info = start_registry(registry_dir)
    stack = replace(stack, registry_url=info.url, started_registry=started)
    stack.save(state_dir)
    try:
        register_schemas(RegistrySettings(info.url), topics, "BACKWARD")
    except (RegistryUnavailable, RegistryRefused) as exc:
        raise StackError(f"registering the schemas at {info.url}: {exc}") from None
    on_step(f"schema registry at {info.url}: schemas registered")
    return stack


def _spawn_all(stack: Stack, state_dir: Path, settings: StackSettings) -> None:
    """The processor, then each consumer, against the stack's bootstrap and prefix."""
    kafka = ["--bootstrap", stack.bootstrap, "--topic-prefix", settings.prefix, "--metrics-port", "0"]
    registry = ["--registry", stack.registry_url] if stack.registry_url else []
    _spawn(stack, state_dir, "processor", ["processor", *kafka, *registry, "--instance", "local-p0"])
    for name in settings.consumer_names():
        engine = ["--engine", settings.engine, *(f"--engine-opt={o}" for o in settings.engine_opts)]
        contract = ["--id", name, "--model", settings.model]
        contract += ["--budget", str(CONSUMER_BUDGET_TOKENS), "--items", str(CONSUMER_MAX_ITEMS)]
        _spawn(stack, state_dir, name, ["consumer", *kafka, *contract, *engine])


def _spawn(stack: Stack, state_dir: Path, name: str, args: Sequence[str]) -> None:
    """Start ``tokenfabric ARGS`` detached (its own session: a Ctrl-C in this terminal does not reach
    it), output to ``logs/NAME.log``, and record it in the stack file at once."""
    log = Path(stack.log_dir) / f"{name}.log"
    argv = [sys.executable, "-m", "processor", *args]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(stack.bootstrap),
            start_new_session=True,
        )
    _await_exec(proc.pid, argv)
    stack.processes.append(StackProcess(name, proc.pid, argv, str(log)))
    stack.save(state_dir)


def _await_exec(pid: int, argv: list[str], timeout_s: float = 5.0) -> None:
    """Wait until ``pid`` shows ``argv`` as its command line. Popen can return while the child is
    still inside exec, and its /proc cmdline reads empty for that moment (measured here: 3 spawns in
    200), which :meth:`StackProcess.alive` would take for a process that already exited. A child that
    really dies at once never shows it: this gives up after ``timeout_s`` and ``alive`` says so."""
    deadline = time.monotonic() + timeout_s
    while process_argv(pid) != argv and time.monotonic() < deadline:
        time.sleep(0.01)


def _wait_announced(
    stack: Stack, settings: StackSettings, conf: dict[str, str], topics: TopicNames, timeout_s: float
) -> None:
    wanted = set(settings.consumer_names())
    deadline = time.monotonic() + timeout_s
    while True:
        for p in stack.processes:
            if not p.alive():
                raise StackError(f"{p.name} exited during start; its log: {p.log}")
        if wanted <= set(consumers_of(settings.model, announced_contracts(conf, topics))):
            return
        if time.monotonic() > deadline:
            raise StackError(
                f"the consumers did not announce within {timeout_s:.0f} s; logs in {stack.log_dir}"
            )
        time.sleep(0.5)


def uncollected_jobs(stack: Stack, broker_dir: Path, timeout_s: float = 10.0) -> list[str]:
    """The jobs whose results ``collect`` has not all written, on a broker this stack started and
    that still runs: what stopping it would lose. [] for a broker the stack did not start (``down``
    leaves it running) or one already gone (nothing left to save)."""
    from processor.jobs.topic import read_jobs

    if not stack.started_broker or broker_status(broker_dir) is None:
        return []
    jobs = read_jobs({"bootstrap.servers": stack.bootstrap}, TopicNames(stack.prefix), timeout_s=timeout_s)
    return sorted(
        name
        for name, job in jobs.items()
        if job.state != "aborted" and job.results_ok + job.results_failed < job.items
    )


def stack_down(state_dir: Path, broker_dir: Path, timeout_s: float = 30.0) -> list[str]:
    """Stop what the stack file records (consumers first, then the processor, then a broker ``up``
    started) and remove the file. Returns the names of what was running and is now stopped."""
    stack = Stack.load(state_dir)
    if stack is None:
        return []
    stopped = []
    for p in reversed(stack.processes):  # consumers first: the processor sees them leave
        if p.alive():
            terminate(p.pid, timeout_s, what=p.name, failure=StackError)
            stopped.append(p.name)
    if stack.started_broker and stop_broker(broker_dir):
        stopped.append("kafka")
    if stack.started_registry and stop_registry(registry_state_dir()):
        stopped.append("registry")
    (state_dir / STACK_FILE).unlink(missing_ok=True)
    return stopped
