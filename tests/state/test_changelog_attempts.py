"""Attempts survive a restart and a handover (processor/state/changelog.py): a batch record carries
each item's attempt once one is past its first, and a waiting item past its first attempt has an
``A`` record beside its bit. Records without them read as first attempts."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from processor.state import changelog

ENTRY = changelog.BatchEntry("b1", "card", 3, 128, 8, 1000, False, ((0, 5), (0, 6)), 2, (1,), ((0, 17),))


def test_a_batch_record_keeps_its_items_attempts() -> None:
    retried = dataclasses.replace(ENTRY, attempts=(1, 3))
    state = changelog.ChangelogState()
    state.apply(changelog.batch_key("b1"), retried.value(), 4)
    assert state.batches["b1"] == retried
    assert [state.batches["b1"].attempt(i) for i in range(2)] == [1, 3]


def test_attempts_are_a_tail_earlier_readers_never_reach() -> None:
    """A record of first attempts is the bytes of before; with attempts, those bytes and a tail
    (an earlier processor's reader stops before it, reading its items as first attempts)."""
    plain = ENTRY.value()
    retried = dataclasses.replace(ENTRY, attempts=(2, 1)).value()
    assert retried[: len(plain)] == plain
    assert retried[len(plain) :] == b"\0\0\0\x02\0\0\0\x01"
    assert changelog.BatchEntry.parse("b1", plain).attempts == ()
    assert [changelog.BatchEntry.parse("b1", plain).attempt(i) for i in range(2)] == [1, 1]


@given(st.lists(st.integers(1, 1 << 20), min_size=2, max_size=2), st.integers(0, 4))
def test_any_attempts_round_trip_beside_any_progress(attempts: list[int], done: int) -> None:
    entry = dataclasses.replace(ENTRY, attempts=tuple(attempts), done=tuple(range(min(done, 2))))
    assert changelog.BatchEntry.parse("b1", entry.value()) == entry


def test_a_waiting_items_attempt_lives_until_its_tombstone_in_its_own_partition() -> None:
    key = changelog.attempt_key(0, 42)
    state = changelog.ChangelogState()
    assert state.attempt_of((0, 42)) == 1  # no record: a first attempt
    state.apply(key, changelog.attempt_value(2), 3)
    assert state.attempt_of((0, 42)) == 2
    state.apply(key, None, 1)  # a tombstone in another partition ends nothing here
    assert state.attempt_of((0, 42)) == 2
    state.apply(key, changelog.attempt_value(3), 3)
    assert state.attempts == {(0, 42): (3, 3)}
    state.apply(key, None, 3)
    assert state.attempt_of((0, 42)) == 1 and state.attempts == {}
