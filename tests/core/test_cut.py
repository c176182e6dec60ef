"""The sweep of a lane cut by length (core/cut.py): in streaming, a batch starts at the longest length at
or below where the previous one ended, so a short item is not passed again and again by longer ones
that arrive after it; with nothing arriving meanwhile (a backlog) that is exactly longest first."""

from __future__ import annotations

import random

from processor.core.contract import BatchRule
from processor.core.item import Item
from processor.core.lane import SWEEP_TOP, ByLength
from processor.core.lanes import LaneSettings, LaneTable
from tests.core.helpers import MODEL, SHAPE_A, make_item

ONE_LENGTH_A_BATCH = BatchRule(max_items=64, pad_multiple=8, batching="tokens", budget_tokens=10**6)
"""Room for everything; with the default cut_tokens (64) lengths 100+ tokens apart never share a batch."""


def table() -> LaneTable:
    return LaneTable(LaneSettings())


def place(t: LaneTable, length: int, now_ms: int = 0) -> Item:
    item = make_item(length, t=now_ms)
    t.place(item, now_ms)
    return item


def take(t: LaneTable, rule: BatchRule = ONE_LENGTH_A_BATCH, **kwargs: object) -> list[int]:
    sl = t.shapes[(MODEL, SHAPE_A)]
    taken, _ = t.take_batch(sl, sl.lanes[0], rule, 0, **kwargs)  # type: ignore[arg-type]
    return [it.length for it in taken]


def lane_items(t: LaneTable) -> ByLength:
    items = t.shapes[(MODEL, SHAPE_A)].lanes[0].items
    assert isinstance(items, ByLength)
    return items


def test_a_longer_item_arriving_after_the_sweep_passed_waits_until_the_shorter_ones_left() -> None:
    t = table()
    for n in (900, 500, 100):
        place(t, n)
    assert lane_items(t).sweep == SWEEP_TOP
    assert take(t) == [900]
    place(t, 1000, now_ms=5)  # arrives after the sweep passed its length
    place(t, 300, now_ms=5)  # arrives below the sweep: this pass takes it
    assert [take(t) for _ in range(3)] == [[500], [300], [100]]
    assert lane_items(t).sweep == 100
    assert take(t) == [1000]  # nothing at or below 100 waits: the sweep wraps to the longest
    assert lane_items(t).sweep == 1000
    t.check()


def test_what_is_left_of_a_length_goes_next() -> None:
    t = table()
    for n in (700, 700, 700, 200):
        place(t, n)
    two = BatchRule(max_items=2, pad_multiple=8, batching="tokens", budget_tokens=10**6)
    assert take(t, two) == [700, 700]
    assert lane_items(t).sweep == 700  # inclusive: the third 700 is at the sweep
    place(t, 650, now_ms=2)
    assert [take(t, two) for _ in range(3)] == [[700], [650], [200]]


def test_with_nothing_arriving_the_sweep_is_longest_first() -> None:
    """A backlog: every batch starts at the longest waiting item, as before the sweep (the golden
    outputs of every ``--backlog`` replay are byte-identical across the change)."""
    rng = random.Random(25)
    t = table()
    for _ in range(400):
        place(t, rng.randint(16, 4000))
    rule = BatchRule(max_items=7, pad_multiple=8, batching="tokens", budget_tokens=20_000)
    while t.waiting_items:
        longest = lane_items(t).lengths[-1]
        taken = take(t, rule)
        assert taken[0] == longest
        assert lane_items(t).lengths == [] or lane_items(t).lengths[-1] <= lane_items(t).sweep
    t.check()


def test_anchored_and_leave_longer_batches_leave_the_sweep_where_it_is() -> None:
    t = table()
    items = {n: place(t, n) for n in (5000, 3000, 900, 400)}
    assert take(t, anchor=items[900]) == [900]
    assert lane_items(t).sweep == SWEEP_TOP
    small = BatchRule(max_items=8, pad_multiple=8, batching="tokens", budget_tokens=2048)
    assert take(t, small, leave_longer=True) == [400]  # the two longer ones stay for a bigger card
    assert lane_items(t).sweep == SWEEP_TOP
    assert take(t) == [5000]  # so the bigger card's batch still starts at the longest
    assert lane_items(t).sweep == 5000
    t.check()


def test_a_leave_longer_batch_starts_at_the_sweep_when_that_is_lower() -> None:
    t = table()
    for n in (5000, 1500, 900, 400):
        place(t, n)
    assert take(t) == [5000] and take(t) == [1500]
    place(t, 6000, now_ms=3)  # only a bigger card holds it
    place(t, 1800, now_ms=3)  # the small card holds it, but the sweep has passed it
    small = BatchRule(max_items=8, pad_multiple=8, batching="tokens", budget_tokens=2048)
    assert take(t, small, leave_longer=True) == [900]
    assert lane_items(t).sweep == 900  # it started where the sweep said: it moves the sweep
    assert take(t) == [400]
    assert take(t) == [6000]  # wrapped
    assert take(t) == [1800]
    t.check()
