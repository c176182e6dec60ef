"""Which ingest offsets may be committed (processor/state/offsets.py): never past the oldest message not
yet safe, per partition, and only where that moved since the last commit."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from processor.state.offsets import DeadMark, OffsetTracker


@dataclass
class Mark:
    """What the tracker reads of an ingest item: its offset, and whether what it carried is safe."""

    offset: int
    safe: bool = False


def test_nothing_seen_nothing_to_commit() -> None:
    assert OffsetTracker().committable() == {}
    assert OffsetTracker().unsafe() == 0


def test_the_committable_offset_is_the_first_unsafe_message() -> None:
    tracker = OffsetTracker()
    marks = [Mark(o) for o in range(10, 15)]
    for m in marks:
        tracker.seen(0, m)
    assert tracker.committable() == {0: 10}  # nothing safe yet: the start, not past it
    marks[0].safe = marks[1].safe = True
    assert tracker.committable() == {0: 12}
    marks[3].safe = True  # safe, but behind the unsafe 12: it is read again after a crash
    assert tracker.committable() == {0: 12}
    assert tracker.unsafe() == 2  # 12 and 14


def test_when_everything_is_safe_the_offset_is_one_past_the_last_seen() -> None:
    tracker = OffsetTracker()
    for o in (3, 4, 7):  # a compacted or filtered partition: offsets need not be contiguous
        tracker.seen(2, Mark(o, safe=True))
    assert tracker.committable() == {2: 8}
    assert tracker.unsafe() == 0


def test_an_offset_is_offered_again_only_once_it_moves() -> None:
    tracker = OffsetTracker()
    first, second = Mark(0), Mark(1)
    tracker.seen(0, first)
    tracker.seen(0, second)
    first.safe = True
    assert tracker.committable() == {0: 1}
    assert tracker.committable() == {0: 1}  # not committed yet: offered again
    tracker.committed({0: 1})
    assert tracker.committable() == {}  # committed and unchanged: nothing to do
    second.safe = True
    assert tracker.committable() == {0: 2}


def test_partitions_are_independent() -> None:
    tracker = OffsetTracker()
    marks = {0: Mark(100), 1: Mark(5), 2: Mark(0, safe=True)}
    for partition, mark in marks.items():
        tracker.seen(partition, mark)
    marks[1].safe = True  # moves partition 1 only
    assert tracker.committable() == {0: 100, 1: 6, 2: 1}
    tracker.committed({1: 6})
    assert tracker.committable() == {0: 100, 2: 1}


def test_a_dead_letter_is_unsafe_until_its_delivery_is_acknowledged() -> None:
    tracker = OffsetTracker()
    dead = DeadMark(40)
    tracker.seen(0, dead)
    tracker.seen(0, Mark(41, safe=True))
    assert tracker.committable() == {0: 40}
    dead.safe = True  # what the offset log's delivery callback does
    assert tracker.committable() == {0: 42}


def test_a_dropped_partition_is_forgotten_whole() -> None:
    tracker = OffsetTracker()
    tracker.seen(3, Mark(9))
    tracker.committed({3: 9})
    tracker.drop(3)  # revoked
    assert tracker.committable() == {} and tracker.unsafe() == 0
    tracker.seen(3, Mark(9))  # assigned again: the same offset is offered again, nothing is assumed
    assert tracker.committable() == {3: 9}


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3)), max_size=60),
    st.data(),
)
def test_the_committed_offset_never_passes_an_unsafe_message(
    steps: list[tuple[int, int]], data: st.DataObject
) -> None:
    """Offsets seen in increasing order per partition, marks made safe in any order: every offset the
    tracker offers is the first unsafe message's (or one past the last one seen), never beyond."""
    tracker = OffsetTracker()
    seen: dict[int, list[Mark]] = {}
    committed: dict[int, int] = {}
    for partition, gap in steps:
        marks = seen.setdefault(partition, [])
        mark = Mark((marks[-1].offset if marks else 0) + gap)
        marks.append(mark)
        tracker.seen(partition, mark)
        for m in data.draw(st.lists(st.sampled_from([m for ms in seen.values() for m in ms]), max_size=3)):
            m.safe = True
        offered = tracker.committable()
        assert all(committed.get(p) != o for p, o in offered.items())  # only offsets that moved
        tracker.committed(offered)
        committed.update(offered)
        for p, marks_p in seen.items():
            unsafe = [m.offset for m in marks_p if not m.safe]
            assert committed[p] == (unsafe[0] if unsafe else marks_p[-1].offset + 1)
        assert tracker.unsafe() == sum(not m.safe for ms in seen.values() for m in ms)
