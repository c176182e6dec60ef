"""Existing topics and checkpoints keep working from Kafka 4.1.2 to the current broker (issue 36).

A pipeline is created on a 4.1.2 broker and processes half its work exactly-once (checkpoints,
changelog, committed offsets, transactions); every process stops cleanly; the broker is replaced in
place by the current release (processor.local.jars.KAFKA_VERSION) on the same data dir and port; the
same processor and consumer ids start again, the second half is produced, and the whole run ends
exactly once with a clean audit.

Opt-in (``TOKENFABRIC_UPGRADE_TEST=1``): the 4.1.2 jars are a one-off Maven download of about
45 MB that CI does not otherwise need, and the test takes about two minutes (two broker starts and
two pipeline runs on a shared 2-core machine).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from processor.local import broker as kafka_local
from processor.local.jars import KAFKA_VERSION
from tests.broker.rig import CARDS, Rig, assert_exactly_once, produce, running_rig

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(
        not os.environ.get("TOKENFABRIC_UPGRADE_TEST"), reason="opt-in: TOKENFABRIC_UPGRADE_TEST=1"
    ),
]

OLD = "4.1.2"


def run_until(rig: Rig, n: int, suffix: str) -> dict[str, int | None]:
    """Consumers and a processor until ``n`` items completed, then a clean stop of all of them."""
    for contract in CARDS:
        rig.spawn_consumer(f"{contract.consumer}{suffix}", contract, overhead_ms=2)
    rig.spawn_processor(f"processor{suffix}")
    rig.wait_completed(n, timeout_s=240)
    return rig.pipeline.stop()


def test_a_pipeline_made_on_kafka_4_1_2_resumes_on_the_current_broker(tmp_path: Path) -> None:
    state = tmp_path / "kafka"
    info = kafka_local.start_broker(state, version=OLD)
    try:
        assert json.loads((state / "broker.json").read_text())["kafka_version"] == OLD
        with running_rig(info.bootstrap, tmp_path, consumer_threads=False) as rig:
            first_ids, first_tokens = produce(rig, 1_000, seed=41)
            codes = run_until(rig, len(first_ids), "-old")
            assert set(codes.values()) == {0}, codes
            kafka_local.restart_broker(state, version=KAFKA_VERSION)  # the upgrade, in place
            assert json.loads((state / "broker.json").read_text())["kafka_version"] == KAFKA_VERSION
            rig.pipeline.procs.clear()
            more_ids, more_tokens = produce(rig, 1_000, seed=42, id_prefix="after-")
            codes = run_until(rig, len(first_ids) + len(more_ids), "-new")
            assert set(codes.values()) == {0}, codes
            assert_exactly_once(rig, first_ids | more_ids, first_tokens + more_tokens)
    finally:
        kafka_local.stop_broker(state)
