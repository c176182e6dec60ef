"""Two processors in one group split the ingest partitions; one is killed, the other takes its lane state
over from the changelog; it comes back and a rebalance hands partitions back. Every item ends exactly
once and the audit is clean."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.ops.status import gather
from processor.sim.tracegen import synthetic_records
from tests.faultrig import Rig, assert_exactly_once, running_rig

pytestmark = pytest.mark.kafka

GROUP_ARGS = ("--session-timeout-ms", "6000", "--transaction-timeout-ms", "5000")


def produce_paced(rig: Rig, n: int, seed: int, seconds: float) -> tuple[set[str], int, threading.Thread]:
    """Produce ``n`` items spread over ``seconds`` in a thread, so faults land mid-stream."""
    records = synthetic_records(n, seed=seed, shapes=16, min_len=16, max_len=600, rate_per_s=None)

    def run() -> None:
        started = time.monotonic()
        with TokenProducer(rig.conf, rig.topics) as producer:
            for i, r in enumerate(records):
                producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
                ahead = started + seconds * i / n - time.monotonic()
                if ahead > 0.01:
                    time.sleep(ahead)

    thread = threading.Thread(target=run, name="producer")
    thread.start()
    return {r.id for r in records}, sum(r.length for r in records), thread


def owned(rig: Rig) -> dict[str, int]:
    """Ingest partitions each instance held at its latest checkpoint."""
    view = gather(rig.conf, rig.topics, group=rig.group)
    return {name: cp.counters.get("owned_partitions", 0) for name, cp in view.checkpoints.items()}


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def test_a_killed_processors_partitions_are_taken_over_and_handed_back(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with running_rig(kafka_bootstrap, tmp_path, ingest_partitions=4) as rig:
        ids, tokens, producer = produce_paced(rig, 12_000, seed=17, seconds=40)
        rig.spawn_processor("a", instance="a", extra=GROUP_ARGS)
        rig.spawn_processor("b", instance="b", extra=GROUP_ARGS)
        wait_for("both instances to own partitions", lambda: sorted(owned(rig).values()) == [2, 2], 90)

        rig.pipeline.procs["b"].send_signal(signal.SIGKILL)
        rig.pipeline.procs["b"].wait()
        # b's last checkpoint still says 2; a's says 4 once the group gave it b's partitions
        wait_for("a to take over b's partitions", lambda: owned(rig).get("a") == 4, 90)
        taken_over = gather(rig.conf, rig.topics, group=rig.group).checkpoints["a"].counters

        rig.spawn_processor("b-again", instance="b", extra=GROUP_ARGS)
        wait_for("b to get partitions back", lambda: sorted(owned(rig).values()) == [2, 2], 90)
        producer.join()
        rig.wait_completed(len(ids), timeout_s=240)
        codes = rig.pipeline.stop()

    assert codes["a"] == 0 and codes["b-again"] == 0
    assert_exactly_once(rig, ids, tokens)
    # a adopted b's waiting items or in-flight batches (the stream was mid-flight when b died)
    assert taken_over["adopted_queued_items"] + taken_over["adopted_in_flight_items"] > 0, taken_over
    final = gather(rig.conf, rig.topics, group=rig.group).checkpoints
    assert final["a"].counters["owned_partitions"] == final["b"].counters["owned_partitions"] == 2
