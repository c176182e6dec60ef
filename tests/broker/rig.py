"""The one pipeline rig of the broker tests: topics under a fresh prefix, consumer apps with an instant
engine, a processor, and the checks that read every topic back (read_committed).

Two ways to run the processor and its consumers:

* in this process (:func:`in_process`, :func:`running_in_process`): a ``ProcessorService`` and
  ``ConsumerApp`` s in threads, each with its own Kafka clients, exactly as the services run them; a
  test can read their state (the ledger, counters) and serve their metrics;
* as real processes (:func:`running_rig`, :class:`Rig`): ``tokenfabric processor`` and ``tokenfabric
  consumer`` subprocesses, so SIGKILL and SIGSTOP are real; consumer apps may still run in threads.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from processor.apps.consumer import ConsumerApp, ConsumerHooks, ConsumerSettings
from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.apps.service import ProcessorService
from processor.apps.settings import ProcessorSettings
from processor.core.contract import Contract
from processor.engines.sim import SimEngine
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames, create_topics, topic_specs
from processor.local.pipeline import Pipeline, child_env
from processor.ops.audit import audit
from processor.ops.status import gather
from processor.sim.cardmodel import CardSpec
from processor.sim.tracegen import synthetic_records
from processor.wire.completions import decode_completions
from processor.wire.items import decode_batch
from processor.wire.records import CompletionForm
from processor.wire.registry_framing import RegistryFraming

# -- topics, waiting, producing ---------------------------------------------------------------------


def new_topics(
    bootstrap: str, letter: str, consumers: Iterable[str], ingest_partitions: int = 3
) -> tuple[dict[str, str], TopicNames]:
    """The client settings and every topic of a fresh prefix (``letter`` + 8 hex digits), with a batch
    topic per consumer."""
    conf = {"bootstrap.servers": bootstrap}
    topics = TopicNames(f"{letter}{uuid.uuid4().hex[:8]}")
    create_topics(conf, topic_specs(topics, ingest_partitions=ingest_partitions, consumers=list(consumers)))
    return conf, topics


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


#: How long :func:`produce_paced`'s producer waits for its last messages when it closes.
PACED_CLOSE_S = 180.0


def produce_paced(
    rig: Rig, n: int, seed: int, seconds: float, hurry: threading.Event | None = None
) -> tuple[set[str], int, threading.Thread]:
    """Produce ``n`` items spread over ``seconds`` in a thread, so faults land mid-stream; once
    ``hurry`` is set (the fault has landed), the rest go out unpaced."""
    records = synthetic_records(n, seed=seed, shapes=16, min_len=16, max_len=600, rate_per_s=None)

    def run() -> None:
        started = time.monotonic()
        producer = TokenProducer(rig.conf, rig.topics)
        for i, r in enumerate(records):
            producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
            ahead = started + seconds * i / n - time.monotonic()
            if ahead > 0.01 and not (hurry is not None and hurry.is_set()):
                time.sleep(ahead)
        # Outlasts the outage tests' brokers (58 s away in the 45 s freeze and restart): the default
        # 30 s ended this thread with "still queued" there, though every item arrived.
        producer.close(timeout=PACED_CLOSE_S)

    thread = threading.Thread(target=run, name="producer")
    thread.start()
    return {r.id for r in records}, sum(r.length for r in records), thread


# -- services in threads ----------------------------------------------------------------------------


#: A test's consumer app polls often, so it sees the test's stop at once.
QUICK = ConsumerSettings(poll_timeout_s=0.05)


def instant_app(conf: dict[str, str], topics: TopicNames, contract: Contract, **options: Any) -> ConsumerApp:
    """A consumer app whose simulated engine answers at once; ``options`` are ``ConsumerHooks`` and
    ``ConsumerSettings`` fields."""
    hooks = {name: options.pop(name) for name in HOOKS if name in options}
    return ConsumerApp(
        conf,
        topics,
        contract,
        SimEngine(CardSpec(tokens_per_s=1e9, overhead_ms=0), 0.0),
        replace(QUICK, **options),
        hooks=ConsumerHooks(**hooks),
    )


HOOKS = [f.name for f in fields(ConsumerHooks)]


class Threads:
    """Service loops (``run(stop)``) in threads that share one stop event.

    ``keep_errors``: a loop's exception is kept in ``errors`` (for the test to assert on) and stops the
    others; otherwise it goes to the thread's excepthook, as a plain thread's would.
    """

    def __init__(self, keep_errors: bool = True) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self.keep_errors = keep_errors

    def start(self, run: Callable[[threading.Event], object], name: str | None = None) -> threading.Thread:
        def body() -> None:
            try:
                run(self.stop)
            except BaseException as exc:
                if not self.keep_errors:
                    raise
                self.errors.append(exc)
                self.stop.set()

        thread = threading.Thread(target=body, name=name)
        self.threads.append(thread)
        thread.start()
        return thread

    def join(self, timeout_s: float = 60) -> None:
        """Stop every loop and wait for each (at most ``timeout_s`` apiece)."""
        self.stop.set()
        for t in self.threads:
            t.join(timeout_s)


@dataclass
class InProcess:
    """A processor and consumer apps that run in threads of the test process, against one prefix."""

    conf: dict[str, str]
    topics: TopicNames
    processor: ProcessorService
    apps: list[ConsumerApp] = field(default_factory=list)
    runner: Threads = field(default_factory=Threads)
    started: bool = False

    @property
    def stop(self) -> threading.Event:
        return self.runner.stop

    @property
    def threads(self) -> list[threading.Thread]:
        return self.runner.threads

    @property
    def errors(self) -> list[BaseException]:
        return self.runner.errors

    def add_consumer(self, contract: Contract, **options: Any) -> ConsumerApp:
        """An instant consumer app for ``contract``; it starts at once if the rig has started."""
        app = instant_app(self.conf, self.topics, contract, **options)
        self.apps.append(app)
        if self.started:
            self.runner.start(app.run, contract.consumer)
        return app

    def start(self) -> None:
        """The consumer apps first, then the processor."""
        self.started = True
        for app in self.apps:
            self.runner.start(app.run, app.contract.consumer)
        self.runner.start(self.processor.run, "processor")

    def close(self, timeout_s: float = 60) -> None:
        self.runner.join(timeout_s)


def in_process(
    bootstrap: str,
    contracts: Iterable[Contract],
    *,
    letter: str = "t",
    ingest_partitions: int = 3,
    topics: tuple[dict[str, str], TopicNames] | None = None,
    app_options: Mapping[str, Any] | None = None,
    framing: RegistryFraming | None = None,
    **settings: Any,
) -> InProcess:
    """Topics (unless ``topics`` are given), an instant consumer app per contract (``ConsumerApp``
    keywords from ``app_options``) and a ``ProcessorService`` of ``ProcessorSettings(**settings)`` in
    the group ``<prefix>-proc``; not started."""
    contracts = list(contracts)
    conf, names = topics or new_topics(bootstrap, letter, [c.consumer for c in contracts], ingest_partitions)
    service = ProcessorService(
        conf, names, ProcessorSettings(group_id=f"{names.prefix}-proc", **settings), framing=framing
    )
    rig = InProcess(conf, names, service)
    for contract in contracts:
        rig.add_consumer(contract, **(app_options or {}))
    return rig


@contextmanager
def running_in_process(bootstrap: str, contracts: Iterable[Contract], **kwargs: Any) -> Iterator[InProcess]:
    """:func:`in_process`, started; on the way out every thread is stopped and none may have failed."""
    rig = in_process(bootstrap, contracts, **kwargs)
    rig.start()
    try:
        yield rig
    finally:
        rig.close()
    assert not rig.errors, f"a pipeline thread failed: {rig.errors[0]!r}"


# -- processes --------------------------------------------------------------------------------------

CARDS = (
    Contract("small", "default", budget_tokens=4096, max_items=16, pad_multiple=8, max_inflight=2),
    Contract("large", "default", budget_tokens=8192, max_items=32, pad_multiple=8, max_inflight=2),
)


@dataclass
class Rig:
    conf: dict[str, str]
    topics: TopicNames
    group: str
    pipeline: Pipeline
    bootstrap: str
    commands: dict[str, list[str]] = field(default_factory=dict)

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        """``env``: variables on top of the children's usual ones (``TOKENFABRIC_KAFKA_<PROPERTY>``)."""
        self.commands[name] = args
        self.pipeline.spawn(name, args, {**child_env(self.bootstrap), **(env or {})})

    def respawn_exited(self, code: int) -> list[str]:
        """A supervisor's pass: start again, under a new name, every process that exited with ``code``;
        returns the new names."""
        started = []
        for name, proc in list(self.pipeline.procs.items()):
            if proc.poll() == code and not any(n.startswith(f"{name}+") for n in self.pipeline.procs):
                self.spawn(f"{name}+", self.commands[name])
                started.append(f"{name}+")
        return started

    def spawn_consumer(
        self,
        name: str,
        contract: Contract,
        overhead_ms: int = 20,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """A real consumer process with the sim engine (``overhead_ms`` per batch)."""
        c = contract
        self.spawn(
            name,
            [
                "consumer", "--bootstrap", self.bootstrap, "--topic-prefix", self.topics.prefix,
                "--id", c.consumer, "--model", c.model, "--budget", str(c.budget_tokens),
                "--items", str(c.max_items), "--pad", str(c.pad_multiple), "--inflight", str(c.max_inflight),
                "--engine", "sim", "--tps", "2000000", "--overhead-ms", str(overhead_ms),
                "--metrics-port", "0", *extra,
            ],
            env,
        )  # fmt: skip

    def spawn_processor(self, name: str, instance: str = "p0", extra: tuple[str, ...] = ()) -> None:
        self.spawn(
            name,
            [
                "processor",
                "--bootstrap",
                self.bootstrap,
                "--topic-prefix",
                self.topics.prefix,
                "--instance",
                instance,
                "--group",
                self.group,
                "--commit-interval-ms",
                "200",
                "--metrics-port",
                "0",
                "--log-level",
                "WARNING",
                *extra,
            ],
        )

    def pipeline_args(self) -> list[str]:
        """The flags that point a command at this rig's pipeline and processor group."""
        return ["--bootstrap", self.bootstrap, "--topic-prefix", self.topics.prefix, "--group", self.group]

    def completed(self) -> int:
        return gather(self.conf, self.topics, group=self.group).total("completed_items")

    def wait_completed(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.completed() < n:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"only {self.completed():,} of {n:,} items completed in {timeout_s:.0f} s"
                )
            time.sleep(0.5)


@contextmanager
def running_rig(
    kafka_bootstrap: str,
    tmp_path: Path,
    ingest_partitions: int = 3,
    consumer_threads: bool = True,
    completions: CompletionForm = "batch",
) -> Iterator[Rig]:
    """Topics and (unless ``consumer_threads`` is False) two consumer apps in threads, writing their
    completions in the ``completions`` form; processors are the test's to spawn."""
    conf, topics = new_topics(kafka_bootstrap, "f", [c.consumer for c in CARDS], ingest_partitions)
    threads = Threads(keep_errors=False)
    for c in CARDS if consumer_threads else ():
        threads.start(instant_app(conf, topics, c, completions=completions).run, c.consumer)
    rig = Rig(conf, topics, f"{topics.prefix}-proc", Pipeline(tmp_path), kafka_bootstrap)
    try:
        yield rig
    finally:
        rig.pipeline.stop()
        threads.join(30)


def produce(rig: Rig, n: int, seed: int, id_prefix: str = "") -> tuple[set[str], int]:
    """``n`` items at once; ``id_prefix`` keeps a second call's ids apart from the first's."""
    records = synthetic_records(n, seed=seed, shapes=12, min_len=16, max_len=600, rate_per_s=None)
    with TokenProducer(rig.conf, rig.topics) as producer:
        for r in records:
            producer.send(id_prefix + r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
    return {id_prefix + r.id for r in records}, sum(r.length for r in records)


def assert_exactly_once(rig: Rig, ids: set[str], tokens: int) -> None:
    dispatched: Counter[str] = Counter()
    for contract in CARDS:
        for msg in read_topic(rig.conf, rig.topics.batches(contract.consumer)):
            batch = decode_batch(msg.value())
            assert len({it.shape for it in batch.items}) == 1
            dispatched.update(it.item_id for it in batch.items)
    completed: Counter[str] = Counter()
    where: dict[str, list[str]] = {}  # item -> each completion: batch, attempt, results partition@offset
    for msg in read_topic(rig.conf, rig.topics.results):
        for c in decode_completions(msg.value()):
            completed[c.item_id] += 1
            where.setdefault(c.item_id, []).append(
                f"batch {c.batch_id} attempt {c.attempt} by {c.consumer} at "
                f"results[{msg.partition()}]@{msg.offset()} completed_ms {c.completed_ms}"
            )
    assert set(dispatched) == ids, f"{len(ids - set(dispatched))} never dispatched"
    assert max(dispatched.values()) == 1, (
        f"dispatched twice: {[k for k, v in dispatched.items() if v > 1][:5]}"
    )
    assert set(completed) == ids
    twice = [k for k, v in completed.items() if v > 1]
    assert not twice, f"completed twice: {twice[:5]}; " + "; ".join(
        f"{k}: {' / '.join(where[k])}" for k in twice[:3]
    )
    view = gather(rig.conf, rig.topics, group=rig.group)
    t = view.total
    assert (t("received_items"), t("received_tokens")) == (len(ids), tokens)
    assert (t("completed_items"), t("completed_tokens")) == (len(ids), tokens)
    assert t("queued_items") == t("in_flight_items") == 0
    assert t("routed_tokens") == t("completed_tokens") + t("failed_tokens") + t("in_flight_tokens")
    report = audit(rig.conf, rig.topics, rig.group)
    assert report.clean, "\n".join(report.lines())
    assert (report.received_items, report.completed_items, report.lost_items) == (len(ids), len(ids), 0)


REVIEW_TEMPLATE = """
[[parts]]
name = "system"
cacheable = true
text = "Label the review.\\n"

[[parts]]
name = "review"
text = "Review: {review}\\nLabel:"
"""


def review_job(folder: Path, rows: int, model: str | None = None) -> tuple[Path, Path]:
    """A dataset of ``rows`` reviews (``rows.jsonl``) and a template for it (``t.toml``; the
    template's ``model`` when given), for the job commands' tests."""
    data, template = folder / "rows.jsonl", folder / "t.toml"
    data.write_text("".join(json.dumps({"review": f"row {n}"}) + "\n" for n in range(rows)), encoding="utf-8")
    head = "" if model is None else f'model = "{model}"\n'
    template.write_text(head + REVIEW_TEMPLATE, encoding="utf-8")
    return data, template


def tails(rig: Rig, lines: int = 6) -> str:
    """The last lines above DEBUG of each process's log: what CI prints when this test fails (the logs
    themselves stay on the CI machine)."""
    out = [f"logs in {rig.pipeline.log_dir}"]
    for path in sorted(rig.pipeline.log_dir.glob("*.log")):
        said = [ln for ln in path.read_text(errors="replace").splitlines() if " DEBUG " not in ln]
        out += [f"--- {path.name}", *(ln[:300] for ln in said[-lines:])]
    return "\n".join(out)
