"""The fleet through change, small (benchmarks/bench_rebalance.py --smoke): 2 processors on the
consumer group protocol (KIP-848) and 4 consumer apps under a steady load, then a rolling restart of
every processor, one at a time, and a processor that joins and restores while another is SIGKILLed
(a rebalance landing during a restore; quix-streams#1146). After each event the load stops, every
item must finish and the audit must be clean: nothing lost or doubled, the ledger in balance.

The gaps and times the run reports are wall-clock figures of a shared machine: only their shape is
checked here (docs/benchmarks.md has the measured table); the audits are the assertion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.helpers import run

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
