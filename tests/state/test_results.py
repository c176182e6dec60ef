"""Where the processor reads completions from (processor/state/results.py): replays are told apart
from new completions, and a rewind moves only backwards."""

from __future__ import annotations

from processor.state.results import ResultsCursor


def test_a_completion_read_again_below_the_highest_applied_offset_is_a_replay() -> None:
    cursor = ResultsCursor()
    cursor.start_at({0: 10, 1: 0})
    assert cursor.applied(0, 10) is False and cursor.applied(0, 11) is False
    assert cursor.rewind({0: 5}) is True and cursor.next == {0: 5, 1: 0}
    assert cursor.applied(0, 5) is True  # read again after the rewind
    assert cursor.applied(0, 11) is True and cursor.applied(0, 12) is False
    assert cursor.seen == {0: 13, 1: 0}


def test_a_rewind_never_moves_a_partition_forward() -> None:
    cursor = ResultsCursor()
    cursor.start_at({0: 10, 1: 3})
    assert cursor.rewind({0: 12, 1: 3}) is False and cursor.next == {0: 10, 1: 3}
    assert cursor.rewind({1: 1, 2: 7}) is True and cursor.next == {0: 10, 1: 1, 2: 7}


def test_positions_are_sorted_by_partition_for_a_batchs_record() -> None:
    cursor = ResultsCursor()
    cursor.start_at({2: 4, 0: 9})
    cursor.applied(1, 0)
    assert cursor.positions() == ((0, 9), (1, 1), (2, 4))


def test_a_topic_end_before_its_start_counts_as_zero() -> None:
    cursor = ResultsCursor()
    cursor.start_at({0: -1})
    assert cursor.next == {0: 0} and cursor.seen == {0: 0}
