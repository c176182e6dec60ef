"""Two processors in one group split the ingest partitions; one is killed, the other takes its lane state
over from the changelog; it comes back and a rebalance hands partitions back. Every item ends exactly
once and the audit is clean."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from processor.ops.status import gather
from tests.broker.rig import Rig, assert_exactly_once, produce_paced, running_rig, wait_for

pytestmark = pytest.mark.kafka

GROUP_ARGS = ("--session-timeout-ms", "6000", "--transaction-timeout-ms", "5000")


def owned(rig: Rig) -> dict[str, int]:
    """Ingest partitions each instance held at its latest checkpoint."""
    view = gather(rig.conf, rig.topics, group=rig.group)
    return {name: cp.counters.get("owned_partitions", 0) for name, cp in view.checkpoints.items()}


def received(rig: Rig, instance: str) -> int:
    """Items ``instance``'s last checkpoint says it took from the ingest topic."""
    checkpoint = gather(rig.conf, rig.topics, group=rig.group).checkpoints.get(instance)
    return 0 if checkpoint is None else checkpoint.counters.get("received_items", 0)


def adopted(rig: Rig) -> int:
    """Items a's last checkpoint says it adopted from another instance, waiting or in flight."""
    counters = gather(rig.conf, rig.topics, group=rig.group).checkpoints["a"].counters
    return counters["adopted_queued_items"] + counters["adopted_in_flight_items"]


def test_a_killed_processors_partitions_are_taken_over_and_handed_back(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with running_rig(kafka_bootstrap, tmp_path, ingest_partitions=4) as rig:
        ids, tokens, producer = produce_paced(rig, 12_000, seed=17, seconds=40)
        rig.spawn_processor("a", instance="a", extra=GROUP_ARGS)
        rig.spawn_processor("b", instance="b", extra=GROUP_ARGS)
        # and b at work on its own: under the consumer protocol its checkpoint can say 2 before it
        # read any of them, and then a, taking them back, has nothing to adopt (b received 0 items
        # in one run: the wait below timed out at 180 s though every item completed once)
        wait_for(
            lambda: sorted(owned(rig).values()) == [2, 2] and received(rig, "b") > 0,
            90,
            "both instances to own partitions, and b to read from its own",
        )

        rig.pipeline.procs["b"].send_signal(signal.SIGKILL)
        rig.pipeline.procs["b"].wait()
        # b's last checkpoint still says 2; a's says 4 once the group gave it b's partitions
        # a checkpoint may list a partition the group assigned before the loop restored it (issue 36:
        # restores run from the loop), so wait for the adoption itself, not only the ownership
        wait_for(lambda: owned(rig).get("a") == 4 and adopted(rig) > 0, 180, "a to take over b's partitions")
        taken_over = gather(rig.conf, rig.topics, group=rig.group).checkpoints["a"].counters

        rig.spawn_processor("b-again", instance="b", extra=GROUP_ARGS)
        wait_for(lambda: sorted(owned(rig).values()) == [2, 2], 90, "b to get partitions back")
        producer.join()
        rig.wait_completed(len(ids), timeout_s=240)
        codes = rig.pipeline.stop()

    assert codes["a"] == 0 and codes["b-again"] == 0
    assert_exactly_once(rig, ids, tokens)
    # a adopted b's waiting items or in-flight batches (the stream was mid-flight when b died)
    assert taken_over["adopted_queued_items"] + taken_over["adopted_in_flight_items"] > 0, taken_over
    final = gather(rig.conf, rig.topics, group=rig.group).checkpoints
    assert final["a"].counters["owned_partitions"] == final["b"].counters["owned_partitions"] == 2
