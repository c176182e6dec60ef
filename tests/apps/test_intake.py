"""The intake's hold on partitions while the schema registry does not answer (processor/apps/intake.py),
without Kafka: which held partitions it resumes."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from processor.apps.intake import Intake
from processor.apps.observe import ServiceCounters
from processor.kafka.topics import TopicNames


class Ingest:
    """The ingest consumer as the intake sees it: what it resumes."""

    def __init__(self) -> None:
        self.resumed: list[tuple[int, int]] = []

    def resume(self, tps: list[TopicPartition]) -> None:
        self.resumed += [(tp.partition, tp.offset) for tp in tps]


def test_a_held_partition_pending_a_restore_is_left_to_the_handover_not_resumed() -> None:
    """Under the consumer protocol a partition held for a silent registry may move and come back
    meanwhile: paused and pending its restore. Resuming it would read it before its lanes are back."""
    ingest = Ingest()
    intake = Intake(None, None, TopicNames("t"), ServiceCounters(), 0, None, ingest, lambda: 10.0)  # type: ignore[arg-type]
    intake.held = {0: ("t.ingest", 5), 1: ("t.ingest", 9), 2: ("t.ingest", 3)}
    intake.release_held(pending=frozenset({1}))
    assert ingest.resumed == [(0, 5), (2, 3)] and intake.held == {}
    intake.release_held(pending=frozenset())  # nothing held any more: nothing resumed twice
    assert ingest.resumed == [(0, 5), (2, 3)]
