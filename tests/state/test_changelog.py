"""The lane-state changelog (processor/state/changelog.py): records fold back into exactly the waiting
items and open batches, in any partition order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from processor.state import changelog

# -- the changelog fold ------------------------------------------------------------------------


def test_a_tombstone_ends_a_record_only_in_its_own_partition() -> None:
    """An item dispatched from its home partition 1, then put back by a batch whose record lives in
    partition 3: the tombstone in 1 must not erase the new record in 3, in either reading order."""
    key = changelog.waiting_key(1, 42)
    for order in ([(3, changelog.PRESENT), (1, None)], [(1, None), (3, changelog.PRESENT)]):
        state = changelog.ChangelogState()
        for partition, value in order:
            state.apply(key, value, partition)
        assert state.waiting == {(1, 42): 3}


def test_batch_entry_round_trips_its_slot_progress_and_results_position() -> None:
    entry = changelog.BatchEntry("b1", "card", 3, 128, 8, 1000, False, ((0, 5), (0, 6)), 2, (1,), ((0, 17),))
    state = changelog.ChangelogState()
    state.apply(changelog.batch_key("b1"), entry.value(), 4)
    assert state.batches["b1"] == entry
    assert state.homes["b1"] == 4
    assert state.batch_refs() == {(0, 5), (0, 6)}


@given(
    st.text(min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(0, 63), st.integers(0, 1 << 62)), min_size=1, max_size=40),
    st.lists(st.tuples(st.integers(0, 63), st.integers(0, 1 << 62)), max_size=4),
    st.integers(-1, 255),
    st.booleans(),
    st.data(),
)
def test_binary_batch_entries_round_trip(
    consumer: str,
    refs: list[tuple[int, int]],
    results_from: list[tuple[int, int]],
    slot: int,
    oversized: bool,
    data: st.DataObject,
) -> None:
    done = tuple(sorted(data.draw(st.sets(st.integers(0, len(refs) - 1)))))
    entry = changelog.BatchEntry(
        "b", consumer, 7, 1 << 20, 64, 1 << 41, oversized, tuple(refs), slot, done, tuple(results_from)
    )
    value = entry.value()
    assert value[0] == changelog.BATCH_FORMAT
    assert changelog.BatchEntry.parse("b", value) == entry


def _fold(state: changelog.ChangelogState, records: list[tuple[int, bytes, bytes | None]]) -> None:
    for partition, key, value in records:
        state.apply(key, value, partition)


@given(
    st.lists(
        st.lists(
            st.tuples(
                st.booleans(),
                st.integers(0, 2),
                st.integers(0, 2),
                st.sampled_from([0, 1, 7, 8, 65_535, 65_536, 65_537, 1 << 40]),
            ),
            max_size=30,
        ),
        max_size=6,
    )
)
def test_waiting_sets_fold_back_into_exactly_the_waiting_items(
    transactions: list[list[tuple[bool, int, int, int]]],
) -> None:
    """Whatever is added and removed, across any number of commits, the records a commit writes fold
    into the items waiting at that commit, each with its home, and a chunk emptied is tombstoned."""
    sets = changelog.WaitingSets()
    state = changelog.ChangelogState()
    model: dict[tuple[int, int], int] = {}
    for changes in transactions:
        for add, home, partition, offset in changes:
            ref = (partition, offset)
            if add and ref not in model:
                sets.add_all([changelog.WaitingRef(home, partition, offset)])
                model[ref] = home
            elif not add and ref in model:
                sets.discard_all([changelog.WaitingRef(model.pop(ref), partition, offset)])
        _fold(state, sets.flush())
        assert state.waiting == model
        assert len(sets) == len(model)
    assert sets.flush() == []
    if not model:
        assert state.chunks == {}


def test_legacy_waiting_records_are_rewritten_into_chunks_and_tombstoned() -> None:
    state = changelog.ChangelogState()
    _fold(
        state,
        [
            (1, changelog.waiting_key(1, 5), changelog.PRESENT),
            (3, changelog.waiting_key(0, 70_000), changelog.PRESENT),
        ],
    )
    assert state.waiting == {(1, 5): 1, (0, 70_000): 3}
    sets = changelog.WaitingSets()
    sets.load(state)
    records = sets.flush()
    assert sorted(key[:1] for _p, key, _v in records) == [b"S", b"S", b"W", b"W"]
    _fold(state, records)
    assert state.legacy_waiting == {}
    assert state.waiting == {(1, 5): 1, (0, 70_000): 3}


def test_entries_written_before_slots_existed_still_parse() -> None:
    legacy = (
        b'{"consumer":"c","lane":0,"padded_length":8,"pad_multiple":8,"created_ms":1,'
        b'"oversized":false,"refs":[[0,1]]}'
    )
    entry = changelog.BatchEntry.parse("b", legacy)
    assert (entry.slot, entry.done, entry.results_from) == (-1, (), ())


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2), st.integers(0, 2), st.sampled_from([0, 1, 7, 65_535, 65_536, 65_537, 1 << 40])
        ),
        max_size=40,
    )
)
def test_adding_items_in_one_call_sets_the_bits_adding_them_one_by_one_does(
    refs: list[tuple[int, int, int]],
) -> None:
    """``add_all`` looks a chunk up once per run of items in it: runs broken by a home, a partition
    or a chunk must each land in their own chunk, as they do one at a time."""
    bulk, single = changelog.WaitingSets(), changelog.WaitingSets()
    bulk.add_all([changelog.WaitingRef(*ref) for ref in refs])
    for ref in refs:
        single.add_all([changelog.WaitingRef(*ref)])
    assert sorted(bulk.flush()) == sorted(single.flush())
    assert len(bulk) == len(single)
