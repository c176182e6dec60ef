"""Cancel a job mid-run against a real broker, the processor SIGKILLed while the cancel is applied.

The processor and both consumers run as real processes (``tokenfabric processor``, ``tokenfabric
consumer`` with the sim engine, slowed so that the job is still running when it is cancelled);
``tokenfabric cancel`` is the command itself. Every topic is then read back (read_committed): every
item is answered exactly once, ``ok`` if it was dispatched, ``cancelled`` otherwise, and the audit
re-derives the ledger, the cancelled term included, without a difference.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.cli.tokenfabric import main
from processor.jobs.topic import read_job_share_records
from processor.kafka.reader import read_topic
from processor.ops.audit import AuditReport, audit
from processor.ops.status import gather
from processor.sim.tracegen import synthetic_records
from processor.wire.completions import decode_completions
from processor.wire.items import decode_batch
from tests.broker.rig import CARDS, Rig, running_rig

pytestmark = pytest.mark.kafka

JOB = "nightly"


@contextmanager
def slow_rig(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Rig]:
    """The rig with both consumers as real processes, 60 ms a batch: a job of a few thousand items
    runs for seconds, long enough to end it mid-run."""
    with running_rig(kafka_bootstrap, tmp_path, consumer_threads=False) as r:
        for c in CARDS:
            r.spawn_consumer(f"consumer-{c.consumer}", c, overhead_ms=60)
        yield r


@pytest.fixture
def rig(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Rig]:
    with slow_rig(kafka_bootstrap, tmp_path) as r:
        yield r


def produce_job(rig: Rig, n: int, seed: int, prefix: str = "r", job: str = JOB) -> set[str]:
    """``n`` items of ``job``, ids ``<prefix><n>``."""
    records = synthetic_records(n, seed=seed, shapes=6, min_len=16, max_len=400, rate_per_s=None)
    with TokenProducer(rig.conf, rig.topics) as producer:
        for r in records:
            item_id = f"{prefix}{r.id}"
            producer.send(item_id, r.model, synthetic_tokens(item_id, r.length), shape=r.shape, job_id=job)
    return {f"{prefix}{r.id}" for r in records}


def answers(rig: Rig) -> dict[str, Counter[str]]:
    """Per status, how often each item is answered on the results topic."""
    out: dict[str, Counter[str]] = {}
    for msg in read_topic(rig.conf, rig.topics.results):
        for c in decode_completions(msg.value()):
            out.setdefault(c.status, Counter())[c.item_id] += 1
    return out


def dispatched(rig: Rig) -> Counter[str]:
    out: Counter[str] = Counter()
    for c in CARDS:
        for msg in read_topic(rig.conf, rig.topics.batches(c.consumer)):
            out.update(it.item_id for it in decode_batch(msg.value()).items)
    return out


def wait_answered(rig: Rig, n: int, timeout_s: float) -> dict[str, Counter[str]]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = answers(rig)
        count = sum(len(c) for c in got.values())
        if count >= n:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"only {count:,} of {n:,} items answered in {timeout_s:.0f} s: {got.keys()}")
        time.sleep(0.5)


def answered_once(rig: Rig, ids: set[str], timeout_s: float = 180) -> dict[str, set[str]]:
    """Wait for every id to be answered; each exactly once over every status; the ids per status."""
    got = wait_answered(rig, len(ids), timeout_s)
    time.sleep(2)  # a late repeat would show up by now
    got = answers(rig)
    total: Counter[str] = sum(got.values(), Counter())
    assert set(total) == ids
    assert max(total.values()) == 1, f"answered twice: {[k for k, v in total.items() if v > 1][:5]}"
    return {status: set(c) for status, c in got.items()}


def clean_audit(rig: Rig) -> AuditReport:
    deadline = time.monotonic() + 30
    while True:  # the processors' last checkpoint may lag their last answer by a commit interval
        report = audit(rig.conf, rig.topics, rig.group)
        if report.clean or time.monotonic() > deadline:
            assert report.clean, "\n".join(report.lines())
            return report
        time.sleep(1)


def test_a_cancel_mid_job_with_the_processor_killed_during_it_answers_every_row_once(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = produce_job(rig, 3_000, seed=27)
    rig.spawn_processor("processor-0")
    deadline = time.monotonic() + 60
    while sum(len(c) for c in answers(rig).values()) < 300:  # the job is under way
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    assert main(["cancel", JOB, "--bootstrap", rig.bootstrap, "--topic-prefix", rig.topics.prefix]) == 0
    time.sleep(0.3)  # the processor reads the cancel and answers in its open transaction...
    proc = rig.pipeline.procs["processor-0"]
    assert proc.poll() is None, "processor-0 died on its own"
    proc.send_signal(signal.SIGKILL)  # ... and dies while it does
    proc.wait()
    # the items were produced under a job id with no job record: cancelled all the same, with a warning
    assert f"warning: no job {JOB!r} on {rig.topics.jobs}" in capsys.readouterr().err
    assert read_job_share_records(rig.conf, rig.topics)[JOB].cancelled_ms is not None  # `jobs`: cancelling
    late = produce_job(rig, 200, seed=28, prefix="late-")  # in ingest when the next processor starts
    rig.spawn_processor("processor-1")
    statuses = answered_once(rig, ids | late)
    sent = dispatched(rig)
    assert max(sent.values()) == 1
    assert statuses["ok"] == set(sent)  # what went out finished; nothing cancelled went out
    assert statuses["cancelled"] == (ids | late) - set(sent)
    assert late <= statuses["cancelled"]
    assert len(statuses["cancelled"]) > 1_000  # the cancel came mid-job
    report = clean_audit(rig)
    assert report.cancelled_items == len(statuses["cancelled"])
    assert report.lost_items == 0 and report.ended_dispatched == 0
    view = gather(rig.conf, rig.topics, group=rig.group)
    assert view.held("queued_items") == 0
    codes = rig.pipeline.stop()
    assert codes["processor-1"] == 0
