"""The fleet through change, small (benchmarks/bench_rebalance.py --smoke): 2 processors on the
consumer group protocol (KIP-848) and 4 consumer apps under a steady load, then a rolling restart of
every processor, one at a time, and a processor that joins and restores while another is SIGKILLed
(a rebalance landing during a restore; quix-streams#1146). After each event the load stops, every
item must finish and the audit must be clean: nothing lost or doubled, the ledger in balance.

The gaps and times the run reports are wall-clock figures of a shared machine: only their shape is
checked here (docs/benchmarks.md has the measured table); the audits are the assertion."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.kafka.exits import EXIT_TEMPFAIL
from processor.local import broker as kafka_local
from tests.benchmarks.helpers import run
from tests.broker.rig import assert_exactly_once, produce, produce_paced, running_rig

pytestmark = pytest.mark.kafka


def test_a_rolling_restart_and_a_kill_during_a_restore_end_with_the_audit_clean(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    out = tmp_path / "rebalance.json"
    args = ["--smoke", "--protocols", "consumer", "--bootstrap", kafka_bootstrap, "--json", str(out)]
    run("bench_rebalance.py", *args, "--logs", str(tmp_path / "logs"), timeout_s=420)
    events = json.loads(out.read_text())["protocols"]["consumer"]["events"]
    assert [e["event"] for e in events] == ["processor-rolling-restart", "kill-during-restore"]
    for e in events:
        assert e["audit_clean"] is True, e
        assert min(e["max_gap_unaffected_ms"], e["max_gap_moved_ms"], e["stable_after_ms"]) >= 0
    # the kill moved the victim's partitions: something was moved, and dispatch came back after it
    assert events[1]["max_gap_moved_ms"] > 0


@pytest.fixture
def private_bootstrap(tmp_path: Path) -> Iterator[str]:
    """A broker of this test's own (processor/local/broker.py: consumer-protocol sessions may be 6 s),
    so the pause below outlasts the session whatever the shared broker allows."""
    state = tmp_path / "kafka"
    info = kafka_local.start_broker(state)
    try:
        yield info.bootstrap
    finally:
        kafka_local.stop_broker(state)


def test_a_processor_paused_past_its_session_is_fenced_by_the_group_and_nothing_doubles(
    private_bootstrap: str, tmp_path: Path
) -> None:
    """Exactly-once under the consumer protocol: p1 is frozen (SIGSTOP) for twice its 6 s session,
    shorter than its 30 s transaction timeout, so only the group can fence it. p0 takes its
    partitions over meanwhile. On SIGCONT the zombie's open transaction is refused (its member epoch
    is stale): it may not commit what it did while paused. It ends asking for a restart (75) or
    rejoins; either way every item completes once and the audit is clean."""
    args = (
        "--session-timeout-ms",
        "6000",
        "--transaction-timeout-ms",
        "30000",
        "--group-protocol",
        "consumer",
    )
    with running_rig(private_bootstrap, tmp_path, ingest_partitions=4) as rig:
        ids, tokens, producing = produce_paced(rig, 6_000, seed=23, seconds=40)
        rig.spawn_processor("p0", instance="p0", extra=args)
        rig.spawn_processor("p1", instance="p1", extra=args)
        rig.wait_completed(1, timeout_s=120)
        zombie = rig.pipeline.procs["p1"]
        time.sleep(3)  # both own partitions and dispatch
        zombie.send_signal(signal.SIGSTOP)
        time.sleep(12)
        zombie.send_signal(signal.SIGCONT)
        time.sleep(8)
        code = zombie.poll()
        assert code in (None, EXIT_TEMPFAIL), (rig.pipeline.log_dir / "p1.log").read_text()[-3000:]
        rig.respawn_exited(EXIT_TEMPFAIL)
        producing.join()
        rig.wait_completed(len(ids), timeout_s=240)
        log = (rig.pipeline.log_dir / "p1.log").read_text()
        rig.pipeline.stop()
    assert "Traceback" not in log, log[-3000:]
    assert_exactly_once(rig, ids, tokens)


def test_a_processor_restarted_at_once_after_a_sigkill_waits_for_its_instance_id(
    private_bootstrap: str, tmp_path: Path
) -> None:
    """Static membership under the consumer protocol: the SIGKILLed member never left, so the group
    refuses its id to a newer member until the session (6 s) times out, fatally in librdkafka. The
    replacement, started at once as a pod's restart would be, says so in one line, waits, joins and
    finishes the work: nothing lost or doubled."""
    args = ("--session-timeout-ms", "6000", "--group-protocol", "consumer")
    with running_rig(private_bootstrap, tmp_path, ingest_partitions=2) as rig:
        ids, tokens = produce(rig, 3_000, seed=29)
        rig.spawn_processor("first", instance="p0", extra=args)
        rig.wait_completed(1, timeout_s=120)
        first = rig.pipeline.procs["first"]
        first.send_signal(signal.SIGKILL)
        first.wait()
        rig.spawn_processor("again", instance="p0", extra=args)
        rig.wait_completed(len(ids), timeout_s=240)
        codes = rig.pipeline.stop()
    log = (rig.pipeline.log_dir / "again.log").read_text()
    assert codes["again"] == 0, log[-3000:]
    waits = [line for line in log.splitlines() if "the group still holds instance id" in line]
    assert len(waits) == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert_exactly_once(rig, ids, tokens)
