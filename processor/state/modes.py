"""A delivery mode as a composition of roles, each with one home:

- durability (processor/state/durability.py): how progress becomes durable;
- the lane log (processor/state/lane_log.py, processor/state/changelog_writer.py): what is recorded
  of each item's way, and the in-flight log, what a restorable log rewrites while a batch is out;
- dedupe (processor/state/dedupe.py): a producer's repeats within the window;
- slot placement (processor/state/placement.py): a consumer's slot share and a batch's changelog place;
- ownership (processor/state/ownership.py): what start, a revocation and an assignment mean.

The service and the handover call the roles; nothing branches on the mode. :func:`exactly_once` and
:func:`at_least_once` build the two compositions: the at-least-once one is the plain durability and
the offset log with the null dedupe, in-flight log and placement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from processor.kafka.exits import now_stamp
from processor.kafka.topics import TopicNames
from processor.state.changelog_writer import ChangelogWriter
from processor.state.dedupe import Dedupe, NoDedupe, WindowDedupe
from processor.state.durability import CommitClients, Durability, PlainCommits, Transactions
from processor.state.lane_log import InFlightLog, LaneLog, NoInFlightLog, OffsetLog
from processor.state.offsets import OffsetTracker
from processor.state.ownership import MovesWithPartitions, Ownership, StaysWithInstance
from processor.state.placement import AllSlots, PartitionSlots, SlotPlacement


@dataclass(frozen=True, slots=True)
class DeliveryMode:
    """The roles of one delivery mode, built once by the service."""

    durability: Durability
    lane_log: LaneLog
    in_flight: InFlightLog
    dedupe: Dedupe
    placement: SlotPlacement
    ownership: Ownership


@dataclass(frozen=True, slots=True)
class ExactlyOnceOptions:
    """What exactly-once needs beyond the clients: the core's view of in-flight batches, the eager
    commit and the dedupe window (0: off), and the clocks (tests move them)."""

    is_in_flight: Callable[[str], bool]
    done_items: Callable[[str], list[str]]
    eager_ms: int
    dedupe_window_ms: int = 0
    dedupe_max_ids: int = 0
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    stamp: Callable[[], tuple[float, float]] = now_stamp


def exactly_once(
    clients: CommitClients, topics: TopicNames, instance: str, interval_ms: int, options: ExactlyOnceOptions
) -> DeliveryMode:
    """Transactions that carry the changelog; lane state moves with partitions."""
    o = options
    dedupe: Dedupe = NoDedupe()
    if o.dedupe_window_ms > 0:
        dedupe = WindowDedupe(o.dedupe_window_ms, o.dedupe_max_ids, o.wall_ms)
    writer = ChangelogWriter(o.is_in_flight, o.done_items, dedupe)
    durability = Transactions(
        clients, topics, instance, interval_ms, eager_ms=o.eager_ms, changes=writer.changes, stamp=o.stamp
    )
    return DeliveryMode(durability, writer, writer, dedupe, PartitionSlots(), MovesWithPartitions(writer))


def at_least_once(
    clients: CommitClients, topics: TopicNames, instance: str, interval_ms: int
) -> DeliveryMode:
    """Plain produces and offset commits past what is safe; lane state stays with the instance."""
    offsets = OffsetTracker()
    durability = PlainCommits(clients, topics, instance, interval_ms, offsets)
    lane_log = OffsetLog(offsets, durability.failed)
    return DeliveryMode(
        durability, lane_log, NoInFlightLog(), NoDedupe(), AllSlots(), StaysWithInstance(offsets)
    )
