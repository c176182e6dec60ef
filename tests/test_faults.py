"""Fault tests: kill the processor at seeded random instants, fence a zombie, and check nothing was lost
or doubled by reading every topic back (read_committed), not by asking the processor.

The processor runs as a real subprocess (``tokenfabric processor``) so SIGKILL and SIGSTOP are real;
the two consumer apps run in threads of the test with an instant simulated engine.
"""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from processor import codec
from processor.audit import audit
from processor.cardmodel import CardSpec
from processor.cli import main
from processor.consumer_app import ConsumerApp
from processor.contract import Contract
from processor.demo import Pipeline, child_env
from processor.engines.sim import SimEngine
from processor.producer import TokenProducer, synthetic_tokens
from processor.replay import read_topic
from processor.status import gather
from processor.topics import TopicNames, create_topics, topic_specs
from processor.tracegen import synthetic_records

pytestmark = pytest.mark.kafka

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

    def spawn_processor(self, name: str, instance: str = "p0") -> None:
        self.pipeline.spawn(
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
            ],
            child_env(self.bootstrap),
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


@pytest.fixture
def rig(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Rig]:
    conf = {"bootstrap.servers": kafka_bootstrap}
    topics = TopicNames(f"f{uuid.uuid4().hex[:8]}")
    create_topics(conf, topic_specs(topics, ingest_partitions=3, consumers=[c.consumer for c in CARDS]))
    stop = threading.Event()
    apps = [
        ConsumerApp(
            conf, topics, c, SimEngine(CardSpec(tokens_per_s=1e9, overhead_ms=0), 0.0), poll_timeout_s=0.05
        )
        for c in CARDS
    ]
    threads = [threading.Thread(target=app.run, args=(stop,), name=app.contract.consumer) for app in apps]
    for t in threads:
        t.start()
    rig = Rig(conf, topics, f"{topics.prefix}-proc", Pipeline(tmp_path), kafka_bootstrap)
    yield rig
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
            batch = codec.decode_batch(msg.value())
            assert len({it.shape for it in batch.items}) == 1
            dispatched.update(it.item_id for it in batch.items)
    completed: Counter[str] = Counter()
    for msg in read_topic(rig.conf, rig.topics.results):
        completed[codec.decode_completion(msg.value()).item_id] += 1
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


def test_processor_killed_at_five_random_instants_dispatches_every_item_exactly_once(rig: Rig) -> None:
    ids, tokens = produce(rig, 20_000, seed=7)
    rng = random.Random(20261129)
    for kill in range(5):
        rig.spawn_processor(f"processor-{kill}")
        time.sleep(rng.uniform(1.5, 5.0))  # mid-consume, mid-dispatch or mid-commit: wherever it is
        proc = rig.pipeline.procs[f"processor-{kill}"]
        assert proc.poll() is None, f"processor-{kill} died on its own"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rig.spawn_processor("processor-final")
    rig.wait_completed(len(ids), timeout_s=240)
    codes = rig.pipeline.stop()
    assert codes["processor-final"] == 0
    assert_exactly_once(rig, ids, tokens)


def test_a_zombie_processor_is_fenced_and_emits_nothing(rig: Rig) -> None:
    ids, tokens = produce(rig, 5_000, seed=11)
    rig.spawn_processor("old")
    time.sleep(3)
    old = rig.pipeline.procs["old"]
    old.send_signal(signal.SIGSTOP)  # paused, as a GC pause or a frozen VM would
    rig.spawn_processor("new")
    time.sleep(4)  # the replacement fences the old transactional id and takes over
    old.send_signal(signal.SIGCONT)
    rig.wait_completed(len(ids), timeout_s=240)
    old_code = old.wait(60)
    assert old_code != 0, "the zombie should have stopped on being fenced"
    codes = rig.pipeline.stop()
    assert codes["new"] == 0
    assert_exactly_once(rig, ids, tokens)


def test_the_audit_catches_a_phantom_in_the_checkpoint(rig: Rig) -> None:
    """A checkpoint that claims items waiting that are not there (the reference system's bug)."""
    ids, _ = produce(rig, 500, seed=3)
    rig.spawn_processor("processor")
    rig.wait_completed(len(ids), timeout_s=120)
    assert rig.pipeline.stop()["processor"] == 0
    audit_cli = [
        "audit",
        "--bootstrap",
        rig.bootstrap,
        "--topic-prefix",
        rig.topics.prefix,
        "--group",
        rig.group,
    ]
    assert main(audit_cli) == 0
    latest = gather(rig.conf, rig.topics, group=rig.group).checkpoints["p0"]
    phantom = dict(latest.counters, queued_items=latest.counters["queued_items"] + 1_000_000)
    forged = codec.LedgerSnapshotRecord(
        instance="p0",
        taken_ms=latest.taken_ms + 1,
        sequence=latest.sequence + 1,
        counters=phantom,
        per_model={},
        per_consumer={},
    )
    from confluent_kafka import Producer

    producer = Producer(rig.conf)
    producer.produce(rig.topics.accounting, key=b"p0", value=codec.encode_ledger_snapshot(forged))
    producer.flush(30)
    assert main(audit_cli) == 1
    report = audit(rig.conf, rig.topics, rig.group)
    assert not report.clean
    assert any("queued_items: checkpoint says 1,000,000" in d for d in report.differences), report.differences


def test_a_consumer_killed_mid_batch_loses_and_doubles_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Both consumers are real processes whose engine takes 20 ms a batch, so each of the three SIGKILLs
    most likely lands inside a batch; the replacements must not complete anything twice."""
    conf = {"bootstrap.servers": kafka_bootstrap}
    topics = TopicNames(f"c{uuid.uuid4().hex[:8]}")
    create_topics(conf, topic_specs(topics, ingest_partitions=3, consumers=[c.consumer for c in CARDS]))
    rig = Rig(conf, topics, f"{topics.prefix}-proc", Pipeline(tmp_path), kafka_bootstrap)

    def spawn_consumer(name: str, contract: Contract) -> None:
        rig.pipeline.spawn(
            name,
            [
                "consumer",
                "--bootstrap",
                kafka_bootstrap,
                "--topic-prefix",
                topics.prefix,
                "--id",
                contract.consumer,
                "--model",
                contract.model,
                "--budget",
                str(contract.budget_tokens),
                "--items",
                str(contract.max_items),
                "--pad",
                str(contract.pad_multiple),
                "--inflight",
                str(contract.max_inflight),
                "--engine",
                "sim",
                "--tps",
                "2000000",
                "--overhead-ms",
                "20",
                "--metrics-port",
                "0",
            ],
            child_env(kafka_bootstrap),
        )

    try:
        for contract in CARDS:
            spawn_consumer(contract.consumer, contract)
        rig.spawn_processor("processor")
        ids, tokens = produce(rig, 3_000, seed=5)
        rng = random.Random(42)
        for kill in range(3):
            time.sleep(rng.uniform(1.0, 3.0))
            victim = CARDS[kill % 2]
            proc = rig.pipeline.procs[victim.consumer if kill < 2 else f"{victim.consumer}-1"]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            spawn_consumer(f"{victim.consumer}-{kill + 1}", victim)
        rig.wait_completed(len(ids), timeout_s=240)
    finally:
        codes = rig.pipeline.stop()
    assert codes["processor"] == 0
    assert_exactly_once(rig, ids, tokens)
