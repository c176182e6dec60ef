"""The fault tests' rig: topics, two in-process consumer apps with an instant engine, processor
subprocesses, and the exactly-once check that reads every topic back (read_committed)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from processor.apps.consumer import ConsumerApp
from processor.apps.producer import TokenProducer, synthetic_tokens
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

    def spawn(self, name: str, args: list[str]) -> None:
        self.commands[name] = args
        self.pipeline.spawn(name, args, child_env(self.bootstrap))

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
        self, name: str, contract: Contract, overhead_ms: int = 20, extra: tuple[str, ...] = ()
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
    conf = {"bootstrap.servers": kafka_bootstrap}
    topics = TopicNames(f"f{uuid.uuid4().hex[:8]}")
    create_topics(
        conf,
        topic_specs(topics, ingest_partitions=ingest_partitions, consumers=[c.consumer for c in CARDS]),
    )
    stop = threading.Event()
    apps = [
        ConsumerApp(
            conf,
            topics,
            c,
            SimEngine(CardSpec(tokens_per_s=1e9, overhead_ms=0), 0.0),
            poll_timeout_s=0.05,
            completions=completions,
        )
        for c in (CARDS if consumer_threads else ())
    ]
    threads = [threading.Thread(target=app.run, args=(stop,), name=app.contract.consumer) for app in apps]
    for t in threads:
        t.start()
    rig = Rig(conf, topics, f"{topics.prefix}-proc", Pipeline(tmp_path), kafka_bootstrap)
    try:
        yield rig
    finally:
        rig.pipeline.stop()
        stop.set()
        for t in threads:
            t.join(30)


def produce(rig: Rig, n: int, seed: int) -> tuple[set[str], int]:
    records = synthetic_records(n, seed=seed, shapes=12, min_len=16, max_len=600, rate_per_s=None)
    with TokenProducer(rig.conf, rig.topics) as producer:
        for r in records:
            producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
    return {r.id for r in records}, sum(r.length for r in records)


def assert_exactly_once(rig: Rig, ids: set[str], tokens: int) -> None:
    dispatched: Counter[str] = Counter()
    for contract in CARDS:
        for msg in read_topic(rig.conf, rig.topics.batches(contract.consumer)):
            batch = decode_batch(msg.value())
            assert len({it.shape for it in batch.items}) == 1
            dispatched.update(it.item_id for it in batch.items)
    completed: Counter[str] = Counter()
    for msg in read_topic(rig.conf, rig.topics.results):
        completed.update(c.item_id for c in decode_completions(msg.value()))
    assert set(dispatched) == ids, f"{len(ids - set(dispatched))} never dispatched"
    assert max(dispatched.values()) == 1, (
        f"dispatched twice: {[k for k, v in dispatched.items() if v > 1][:5]}"
    )
    assert set(completed) == ids
    assert max(completed.values()) == 1, f"completed twice: {[k for k, v in completed.items() if v > 1][:5]}"
    view = gather(rig.conf, rig.topics, group=rig.group)
    t = view.total
    assert (t("received_items"), t("received_tokens")) == (len(ids), tokens)
    assert (t("completed_items"), t("completed_tokens")) == (len(ids), tokens)
    assert t("queued_items") == t("in_flight_items") == 0
    assert t("routed_tokens") == t("completed_tokens") + t("failed_tokens") + t("in_flight_tokens")
    report = audit(rig.conf, rig.topics, rig.group)
    assert report.clean, "\n".join(report.lines())
    assert (report.received_items, report.completed_items, report.lost_items) == (len(ids), len(ids), 0)
