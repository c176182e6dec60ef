"""The scheduler's read-only view (core/view.py) and the typed completion record (core/item.py)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from processor.core.item import Item, ItemOutcome
from processor.core.lanes import LaneSettings
from tests.core.helpers import (
    MODEL,
    SHAPE_A,
    SHAPE_B,
    complete_all,
    make_contract,
    make_item,
    make_items,
    make_scheduler,
    submit_all,
)

NARROW = LaneSettings(floor_tokens=0, cap_tokens=256)


def test_waiting_counts_every_item_not_yet_dispatched_per_model_and_shape() -> None:
    sched = make_scheduler(make_contract(items=2, inflight=1), lanes=NARROW)
    items = submit_all(
        sched,
        make_items([100, 200, 300], shape=SHAPE_A)
        + make_items([50, 60], shape=SHAPE_B)
        + [Item("j1", MODEL, SHAPE_B, 70, 0, job="nightly")]
        + make_items([10, 20], model="other"),
    )
    sched.dispatch(0)
    waiting = [it for it in items if not it.dispatched]
    assert 0 < len(waiting) < len(items)  # the consumer took one batch

    view = sched.view
    assert (view.waiting().items, view.waiting().tokens) == (len(waiting), sum(it.length for it in waiting))
    by_shape: Counter[tuple[str, int]] = Counter()
    tokens_by_shape: Counter[tuple[str, int]] = Counter()
    for it in waiting:
        by_shape[(it.model, it.shape)] += 1
        tokens_by_shape[(it.model, it.shape)] += it.length
    assert {k: (w.items, w.tokens) for k, w in view.waiting_by_shape().items()} == {
        k: (by_shape[k], tokens_by_shape[k]) for k in by_shape
    }  # a shape's jobs together
    by_model: Counter[str] = Counter(it.model for it in waiting)
    assert {m: w.items for m, w in view.waiting_by_model().items()} == dict(by_model)
    assert view.waiting_by_model()["other"].tokens == 30


def test_lane_figures_are_the_lane_tables_and_carry_on_over_a_release() -> None:
    sched = make_scheduler(make_contract(items=1, inflight=8), lanes=NARROW)
    submit_all(sched, make_items([100, 1000, 5000]) + make_items([100], shape=SHAPE_B))
    lanes = sched.view.lanes()
    st = sched._context.table.stats
    assert lanes.lanes_in_use == st.lanes_in_use == 4  # three lengths far apart, and shape B's
    assert (lanes.new_lanes, lanes.reuses, lanes.shapes, lanes.lane_budget) == (4, 0, 2, NARROW.lane_budget)
    assert lanes.lanes_in_use_peak == 4 and lanes.lane_pressure_peak == st.lane_pressure_peak > 0

    sched.release_all()
    after = sched.view.lanes()
    assert (after.lanes_in_use, after.shapes) == (0, 0)
    assert (after.new_lanes, after.lanes_in_use_peak) == (4, 4)  # counters of activity carry on
    assert sched.view.waiting().items == 0


def test_consumer_figures_give_the_effective_slots_and_the_batches_held() -> None:
    sched = make_scheduler(make_contract("whole", items=1, inflight=3))
    sched.set_contract(make_contract("shared", items=1, inflight=4), slots=1)
    submit_all(sched, make_items([100] * 6))
    sent = sched.dispatch(0)

    figures = sched.view.consumers()
    assert list(figures) == ["whole", "shared"]
    whole, shared = figures["whole"], figures["shared"]
    assert (whole.slots, whole.in_flight, whole.free_slots) == (3, 3, 0)  # no share: all of max_inflight
    assert (shared.slots, shared.in_flight, shared.free_slots) == (1, 1, 0)
    assert shared.contract == make_contract("shared", items=1, inflight=4)
    assert [b.batch_id for b in whole.batches] == [b.batch_id for b in sent if b.consumer == "whole"]
    held = {b.batch_id for b in whole.batches + shared.batches}
    assert held == {b.batch_id for b in sched.in_flight_batches()}
    assert sched.view.consumer("shared") == shared
    assert sched.view.consumer("nobody") is None and sched.view.contract("nobody") is None
    assert sched.view.contract("whole") == whole.contract

    complete_all(sched, whole.batches, 1)
    assert whole.in_flight == 3  # what a caller holds does not change under it
    assert sched.view.consumers()["whole"].in_flight == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        whole.slots = 9  # type: ignore[misc]

    sched.release_slots()
    assert [c.free_slots for c in sched.view.consumers().values()] == [0, -1]  # "shared" still holds one


def test_shape_switches_and_oversized_are_counted_as_the_scheduler_counts_them() -> None:
    sched = make_scheduler(make_contract(items=8, inflight=1, budget=1024))
    submit_all(sched, [make_item(100, shape=SHAPE_A), make_item(100, shape=SHAPE_B), make_item(4000)])
    for now in range(1, 5):
        complete_all(sched, sched.dispatch(now), now)
    view = sched.view
    assert view.oversized() == sched.oversized == 1  # 4000 tokens against a budget of 1024
    assert view.shape_switches() == view.consumers()["c"].shape_switches == 1  # A, then B


def test_an_item_outcome_is_the_tuple_the_wire_heads_build() -> None:
    outcome = ItemOutcome("i", True)
    assert outcome == ("i", True, False) and isinstance(outcome, tuple)
    assert ItemOutcome(*("i", False, True)).cache_hit is True


@pytest.mark.parametrize("typed", [True, False])
def test_items_done_takes_item_outcomes_or_plain_tuples(typed: bool) -> None:
    sched = make_scheduler(make_contract(items=3, inflight=1))
    submit_all(sched, make_items([97, 99, 100]))  # one padded length: one batch
    (batch,) = sched.dispatch(0)
    first, second, third = batch.items
    answers = [(first.id, True, True), (second.id, False, True), ("unknown", True, False)]
    outcomes = [ItemOutcome(*a) for a in answers] if typed else answers
    assert sched.items_done(batch.batch_id, outcomes, 1) == (2, False)
    assert sched.items_done(batch.batch_id, [ItemOutcome(third.id, True)], 2) == (1, True)
    book = sched.view.consumer_book("c")
    assert (book.completed.items, book.completed.tokens, book.failed.items, book.failed.tokens) == (
        2,
        first.length + third.length,
        1,
        second.length,
    )
    sched.check()
