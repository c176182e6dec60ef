"""Consumer credits shared between processor instances (processor/state/credits.py): every in-flight
slot has exactly one owner, however the partitions are split."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from processor.state.credits import CreditBook, slot_partition

# -- credits -----------------------------------------------------------------------------------


@given(st.integers(1, 64), st.integers(1, 64), st.data())
def test_every_slot_has_exactly_one_owner_however_partitions_are_split(
    max_inflight: int, partitions: int, data: st.DataObject
) -> None:
    owner = data.draw(st.lists(st.integers(0, 3), min_size=partitions, max_size=partitions))
    books = [
        CreditBook(partitions, frozenset(p for p in range(partitions) if owner[p] == i)) for i in range(4)
    ]
    shares = [b.share(max_inflight) for b in books]
    assert sum(shares) == max_inflight  # never more batches than the consumer promised to hold
    owned = [set(b.owned_slots(max_inflight)) for b in books]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not owned[i] & owned[j]


@given(st.integers(1, 16), st.integers(1, 8))
def test_contiguous_ranges_give_every_instance_a_slot_when_partitions_divide_evenly(
    instances: int, per_instance: int
) -> None:
    partitions = instances * per_instance
    for max_inflight in range(instances, instances * 3 + 1):
        for i in range(instances):
            block = frozenset(range(i * per_instance, (i + 1) * per_instance))
            assert CreditBook(partitions, block).share(max_inflight) >= 1, (max_inflight, i)


def test_slots_spread_over_partitions() -> None:
    assert [slot_partition(j, 2, 8) for j in range(2)] == [2, 6]
    assert [slot_partition(j, 3, 8) for j in range(3)] == [1, 4, 6]
    assert [slot_partition(j, 4, 2) for j in range(4)] == [0, 0, 1, 1]


def test_take_uses_owned_slots_only_and_refuses_past_the_share() -> None:
    book = CreditBook(4, frozenset({0, 1}))
    slot, partition = book.take("c", 4, "b1")
    assert (slot, partition) == (0, 0)
    assert book.take("c", 4, "b2") == (1, 1)
    try:
        book.take("c", 4, "b3")
    except RuntimeError as exc:
        assert "no free in-flight slot of the 2" in str(exc)
    else:
        raise AssertionError("a third batch must not get a slot of the other instance's partitions")
    book.free("b1")
    assert book.take("c", 4, "b3") == (0, 0)


def test_an_adopted_batch_whose_slot_is_gone_still_counts() -> None:
    book = CreditBook(2, frozenset({0, 1}))
    assert book.adopt("c", 0, "b1") == 0
    placeholder = book.adopt("c", 0, "b2")  # same slot recorded twice: the consumer shrank max_inflight
    assert placeholder < 0
    assert book.held("c") == 2
    book.free("b2")
    assert book.held("c") == 1
