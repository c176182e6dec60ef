"""The dedupe window: what is a repeat, when an id is forgotten, the cap, and the changelog records
that bring it back after a restart."""

from __future__ import annotations

import random

import pytest

from processor.state.changelog import ChangelogState
from processor.state.seen import BUCKETS, RECORD_IDS, SeenBook, SeenIds, id_hash, unpack_seen

W = 64_000  # a bucket is 1,000 ms
T0 = 1_000_000_000


def restored(book: SeenBook, records: list[tuple[int, bytes, bytes | None]]) -> SeenBook:
    """A fresh book from the records written so far, folded as restore folds the changelog."""
    state = ChangelogState()
    for partition, key, value in records:
        state.apply(key, value, partition)
    again = SeenBook(book.window_ms, book.max_ids)
    again.load(state.seen)
    return again


def test_a_repeat_is_recognised_and_other_ids_are_not() -> None:
    book = SeenBook(W)
    assert book.first(0, "a", T0)
    assert book.first(0, "b", T0)
    assert not book.first(0, "a", T0 + 5)
    assert book.first(1, "a", T0), "partitions remember separately"
    assert len(book) == 3


def test_an_id_is_remembered_for_the_window_and_at_most_one_bucket_more() -> None:
    seen = SeenIds(0, W)
    h = id_hash("x")
    assert seen.first(h, T0)
    seen.flush(T0 + W)
    assert not seen.first(h, T0 + W), "still within the window"
    seen.flush(T0 + W + W // BUCKETS + 1)
    assert len(seen) == 0
    assert seen.first(h, T0 + W + W // BUCKETS + 1), "forgotten once its bucket left the window"


def test_forgetting_a_bucket_keeps_every_other_id_findable() -> None:
    """Backward-shift deletion in a crowded table: the survivors are all still found."""
    rng = random.Random(7)
    seen = SeenIds(0, W)
    old = [rng.getrandbits(64) | 1 for _ in range(3000)]
    young = [rng.getrandbits(64) | 1 for _ in range(3000)]
    for h in old:
        seen.first(h, T0)
    for h in young:
        seen.first(h, T0 + W // 2)
    seen.flush(T0 + W + W // BUCKETS)
    assert len(seen) == len(young)
    assert all(h in seen for h in young)
    assert not any(h in seen for h in old)


def test_the_cap_forgets_the_oldest_buckets_first() -> None:
    seen = SeenIds(0, W, max_ids=100)
    for i in range(80):
        seen.first(id_hash(f"old-{i}"), T0)
    for i in range(80):
        seen.first(id_hash(f"new-{i}"), T0 + 2000)
    seen.flush(T0 + 2000)
    assert len(seen) == 80 and seen.evicted == 80
    assert id_hash("new-3") in seen and id_hash("old-3") not in seen


def test_the_table_grows_and_shrinks_with_what_it_holds() -> None:
    seen = SeenIds(0, W)
    for i in range(10_000):
        seen.first(id_hash(str(i)), T0)
    assert seen.slots >= 10_000 * 4 // 3
    assert all(id_hash(str(i)) in seen for i in range(10_000))
    seen.flush(T0 + 2 * W)
    assert len(seen) == 0 and seen.slots == 1024


def test_records_restore_exactly_what_is_remembered() -> None:
    book = SeenBook(W)
    written: list[tuple[int, bytes, bytes | None]] = []
    for step in range(5):
        for i in range(50):
            book.first(step % 2, f"{step}-{i}", T0 + 700 * step)
        written += book.flush(T0 + 700 * step)
    again = restored(book, written)
    assert len(again) == len(book) == 250
    for step in range(5):
        assert not again.first(step % 2, f"{step}-0", T0 + 4000)
    assert again.first(0, "never", T0 + 4000)


def test_closed_buckets_are_merged_and_expired_ones_tombstoned() -> None:
    book = SeenBook(W)
    written: list[tuple[int, bytes, bytes | None]] = []
    for commit in range(10):  # ten commits in one bucket: ten segments
        book.first(0, f"id-{commit}", T0 + commit)
        written += book.flush(T0 + commit)
    state = ChangelogState()
    for p, k, v in written:
        state.apply(k, v, p)
    assert len(state.seen) == 10
    written += book.flush(T0 + 1000)  # the bucket closed: one record now
    state = ChangelogState()
    for p, k, v in written:
        state.apply(k, v, p)
    assert len(state.seen) == 1
    (value,) = state.seen.values()
    assert sorted(unpack_seen(value)) == sorted(id_hash(f"id-{c}") for c in range(10))
    written += book.flush(T0 + W + 2000)  # expired: tombstoned
    assert restored(book, written).partitions == {}


def test_a_big_bucket_is_split_into_records_under_the_limit() -> None:
    seen = SeenIds(0, W)
    for i in range(RECORD_IDS + 10):
        seen.first(id_hash(str(i)), T0)
    records = seen.flush(T0)
    assert [len(unpack_seen(v)) for _k, v in records if v] == [RECORD_IDS, 10]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        SeenIds(0, 0)
    with pytest.raises(ValueError, match="most ids"):
        SeenIds(0, W, max_ids=-1)


def test_a_processor_restarted_with_another_window_forgets_on_its_own_schedule() -> None:
    """Keys name a bucket by its start time, so records written under a 64 s window expire on time
    when read back under a 640 s one (and the other way round), and every key is tombstoned."""
    book = SeenBook(W)
    written: list[tuple[int, bytes, bytes | None]] = []
    for step in range(6):
        book.first(0, f"id-{step}", T0 + 1500 * step)
        written += book.flush(T0 + 1500 * step)
    wider = SeenBook(10 * W)
    state = ChangelogState()
    for p, k, v in written:
        state.apply(k, v, p)
    wider.load(state.seen)
    assert not wider.first(0, "id-0", T0 + 9000)
    written += wider.flush(T0 + 9000)
    written += wider.flush(T0 + 9000 + 11 * W)
    assert len(wider) == 0
    state = ChangelogState()
    for p, k, v in written:
        state.apply(k, v, p)
    assert state.seen == {}, "every record tombstoned"
