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
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from processor.cli.tokenfabric import main
from processor.core.contract import Contract
from processor.kafka.exits import EXIT_SUPERSEDED, EXIT_TEMPFAIL
from processor.kafka.reader import read_topic
from processor.kafka.topics import create_topics, topic_specs
from processor.ops.audit import audit
from processor.ops.status import gather
from processor.wire.control import encode_contract, encode_ledger_snapshot
from processor.wire.records import ContractRecord, LedgerSnapshotRecord
from processor.wire.schemas import schema_of
from tests.broker.rig import (
    CARDS,
    Rig,
    assert_exactly_once,
    produce,
    produce_paced,
    running_rig,
)

pytestmark = pytest.mark.kafka


@pytest.fixture
def rig(kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """The rig; a test parametrized indirectly on ``rig`` names the consumers' completions form."""
    with running_rig(kafka_bootstrap, tmp_path, completions=getattr(request, "param", "batch")) as r:
        yield r


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
    rig.wait_completed(1, timeout_s=120)  # at work (was a fixed 3 s): its transactions under way
    old = rig.pipeline.procs["old"]
    old.send_signal(signal.SIGSTOP)  # paused, as a GC pause or a frozen VM would
    rig.spawn_processor("new")
    time.sleep(4)  # the replacement fences the old transactional id and takes over
    old.send_signal(signal.SIGCONT)
    rig.wait_completed(len(ids), timeout_s=240)
    old_code = old.wait(60)
    assert old_code == EXIT_SUPERSEDED, "the zombie should stop on being fenced, and not ask for a restart"
    assert_one_line_superseded(rig, "old", "processor p0")
    codes = rig.pipeline.stop()
    assert codes["new"] == 0
    assert_exactly_once(rig, ids, tokens)


def assert_one_line_superseded(rig: Rig, name: str, who: str) -> None:
    """The loser's log says who it is and which pipeline, once, and nothing more alarming."""
    log = (rig.pipeline.log_dir / f"{name}.log").read_text()
    lines = [line for line in log.splitlines() if "a newer process with the same id took over" in line]
    assert len(lines) == 1, log
    assert f"{who} of pipeline {rig.topics.prefix}:" in lines[0], lines[0]
    assert f"exiting with {EXIT_SUPERSEDED}" in lines[0], lines[0]
    assert "Traceback" not in log and "SystemError" not in log, log


def assert_one_line_taking_over(rig: Rig, name: str, who: str) -> None:
    """The newer process says, once, that the id was in use when it started."""
    log = (rig.pipeline.log_dir / f"{name}.log").read_text()
    lines = [line for line in log.splitlines() if "the group still had a member with this id" in line]
    assert len(lines) == 1 and f"{who} of pipeline {rig.topics.prefix}:" in lines[0], log


def test_a_second_processor_with_a_running_instance_id_takes_over_and_the_first_exits_78_once(
    rig: Rig,
) -> None:
    """Two processes given one ``--instance``: the newer wins (its init_transactions and its static
    join fence the older), the older exits 78 with one line, and a supervisor that restarts what
    exits 75 has nothing to restart: no fencing loop."""
    ids, tokens = produce(rig, 4_000, seed=13)
    rig.spawn_processor("first")
    rig.wait_completed(1, timeout_s=120)
    rig.spawn_processor("second")
    first = rig.pipeline.procs["first"]
    assert first.wait(60) == EXIT_SUPERSEDED
    assert_one_line_superseded(rig, "first", "processor p0")
    assert_one_line_taking_over(rig, "second", "processor p0")
    assert rig.respawn_exited(EXIT_TEMPFAIL) == []
    rig.wait_completed(len(ids), timeout_s=240)
    codes = rig.pipeline.stop()
    assert codes["second"] == 0
    assert_exactly_once(rig, ids, tokens)


def test_a_second_consumer_with_a_running_id_takes_over_and_the_first_exits_78_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    small, large = CARDS
    with running_rig(kafka_bootstrap, tmp_path, consumer_threads=False) as rig:
        rig.spawn_consumer("large", large, overhead_ms=1)
        rig.spawn_consumer("small", small, overhead_ms=20)
        rig.spawn_processor("processor")
        ids, tokens = produce(rig, 3_000, seed=19)
        rig.wait_completed(1, timeout_s=120)
        rig.spawn_consumer("small-twin", small, overhead_ms=20)
        assert rig.pipeline.procs["small"].wait(90) == EXIT_SUPERSEDED
        assert rig.respawn_exited(EXIT_TEMPFAIL) == []
        rig.wait_completed(len(ids), timeout_s=240)
        codes = rig.pipeline.stop()
    assert_one_line_superseded(rig, "small", "consumer small")
    assert_one_line_taking_over(rig, "small-twin", "consumer small")
    assert codes["processor"] == codes["small-twin"] == 0
    assert_exactly_once(rig, ids, tokens)


def test_a_processor_paused_past_its_transaction_timeout_exits_75_and_its_restart_loses_nothing(
    rig: Rig,
) -> None:
    """SIGSTOP longer than the transaction timeout plus the broker's sweep of expired transactions
    (``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s): the broker aborts the
    open transaction and fences its epoch. That is no twin, so the processor exits 75 (never 1 with
    a SystemError from a delivery callback during its shutdown), and its restart completes every
    item once.

    Ingest keeps flowing through the pauses (paced), so the processor is inside a transaction when it
    is stopped; a stop that lands between two transactions harms nothing (the processor rightly runs
    on), so the pause is tried again, at most three times; ingest is paced over all three and
    hurried once the processor has exited."""
    hurry = threading.Event()
    ids, tokens, producing = produce_paced(rig, 20_000, seed=31, seconds=200, hurry=hurry)
    short = ("--transaction-timeout-ms", "2000", "--outage-exit-s", "0")  # 0: exit, not ride it out
    rig.spawn_processor("paused", extra=short)
    rig.wait_completed(1, timeout_s=120)
    paused = rig.pipeline.procs["paused"]
    for _attempt in range(3):
        paused.send_signal(signal.SIGSTOP)
        time.sleep(16)
        paused.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 40
        while paused.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if paused.poll() is not None:
            break
    hurry.set()
    assert paused.poll() is not None, "three pauses past the transaction timeout and it still runs"
    producing.join()
    code = paused.returncode
    log = (rig.pipeline.log_dir / "paused.log").read_text()
    assert code == EXIT_TEMPFAIL, log
    assert "past the transaction timeout (2 s)" in log and "a restart recovers" in log, log
    assert "Traceback" not in log and "SystemError" not in log, log
    assert rig.respawn_exited(EXIT_TEMPFAIL) == ["paused+"]
    rig.wait_completed(len(ids), timeout_s=240)
    codes = rig.pipeline.stop()
    assert codes["paused+"] == 0
    assert_exactly_once(rig, ids, tokens)


def test_a_processor_that_cannot_deliver_exits_75_and_its_restart_loses_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A consumer's batch topic is missing (a deploy not finished), so the processor's batches time
    out: it exits 75, having committed nothing past its last commit. Once the topic exists, a
    restarted processor dispatches every item exactly once."""
    from confluent_kafka.admin import AdminClient

    small = CARDS[0]
    with running_rig(kafka_bootstrap, tmp_path, consumer_threads=False) as rig:
        admin = AdminClient(rig.conf)
        for future in admin.delete_topics([rig.topics.batches(small.consumer)]).values():
            future.result(30)
        announce = encode_contract(ContractRecord(small, int(time.time() * 1000)))
        producer = Producer(rig.conf)
        producer.produce(rig.topics.contracts, announce, small.consumer.encode())
        assert producer.flush(30) == 0
        ids, tokens = produce(rig, 2_000, seed=29)
        quick = tmp_path / "quick.properties"
        quick.write_text("message.timeout.ms=3000\n")
        rig.spawn_processor("impatient", extra=("--kafka-config", str(quick)))
        code = rig.pipeline.procs["impatient"].wait(120)
        log = (rig.pipeline.log_dir / "impatient.log").read_text()
        assert code == 75, log
        assert "a produce failed" in log and "a restart recovers" in log
        assert gather(rig.conf, rig.topics, group=rig.group).total("routed_items") == 0  # nothing committed
        create_topics(rig.conf, topic_specs(rig.topics, consumers=[c.consumer for c in CARDS]))
        for contract in CARDS:
            rig.spawn_consumer(contract.consumer, contract, overhead_ms=1)
        rig.spawn_processor("restarted")
        rig.wait_completed(len(ids), timeout_s=180)
        codes = rig.pipeline.stop()
    assert codes["restarted"] == 0
    assert_exactly_once(rig, ids, tokens)


@pytest.mark.parametrize(
    ("rig", "form"), [("batch", "CompletionBatch"), ("item", "Completion")], indirect=["rig"]
)
def test_the_audit_catches_a_phantom_in_the_checkpoint(rig: Rig, form: str) -> None:
    """A checkpoint that claims items waiting that are not there (the reference system's bug). First
    the run balances, exactly once, whichever form the consumers write their completions in."""
    ids, tokens = produce(rig, 500, seed=3)
    rig.spawn_processor("processor")
    rig.wait_completed(len(ids), timeout_s=120)
    assert rig.pipeline.stop()["processor"] == 0
    assert {schema_of(m.value()) for m in read_topic(rig.conf, rig.topics.results)} == {form}
    assert_exactly_once(rig, ids, tokens)
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
    forged = LedgerSnapshotRecord(
        instance="p0",
        taken_ms=latest.taken_ms + 1,
        sequence=latest.sequence + 1,
        counters=phantom,
        per_model={},
        per_consumer={},
    )
    from confluent_kafka import Producer

    producer = Producer(rig.conf)
    producer.produce(rig.topics.accounting, key=b"p0", value=encode_ledger_snapshot(forged))
    producer.flush(30)
    assert main(audit_cli) == 1
    report = audit(rig.conf, rig.topics, rig.group)
    assert not report.clean
    assert any("queued_items: checkpoint says 1,000,000" in d for d in report.differences), report.differences


def test_a_consumer_killed_mid_batch_loses_and_doubles_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Both consumers are real processes whose engine takes 20 ms a batch, so each of the three SIGKILLs
    most likely lands inside a batch; the replacements must not complete anything twice."""
    with running_rig(kafka_bootstrap, tmp_path, consumer_threads=False) as rig:

        def spawn_consumer(name: str, contract: Contract) -> None:
            rig.spawn_consumer(name, contract)

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
