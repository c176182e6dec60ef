"""The scheduler: how batches are cut, which lane a consumer serves next, and how results come back."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.accounting import LedgerImbalance
from processor.core.contract import InvariantViolation, check_batch
from processor.core.item import Batch, Item
from processor.core.lane import ByLength
from processor.core.lanes import LaneSettings
from processor.core.scheduler import DEADLINES, DispatchSettings, Scheduler
from tests.core.helpers import (
    MODEL,
    SHAPE_A,
    SHAPE_B,
    SHAPE_C,
    assert_batch_ok,
    complete_all,
    drain,
    make_contract,
    make_item,
    make_items,
    make_scheduler,
    submit_all,
)

# every item of a shape joins one lane, cut in arrival order (the first generation's cut)
ONE_LANE = LaneSettings(floor_tokens=4096, cap_tokens=4096, cut="arrival")
# the first generation's narrow lanes (floor 0, cap 256), which the tests of lane structure need
NARROW = LaneSettings(floor_tokens=0, cap_tokens=256)

# ------------------------------------------------------------------------------ cutting batches


def test_batches_fill_the_budget_greedily() -> None:
    sched = make_scheduler(make_contract(budget=4096, pad=8, inflight=10))
    submit_all(sched, make_items([1000] * 10))
    batches = sched.dispatch(0)
    assert [len(b.items) for b in batches] == [4, 4, 2]  # 4 x 1000 <= 4096 < 5 x 1000
    assert [b.padded_tokens for b in batches] == [4000, 4000, 2000]


def test_max_items_caps_a_batch_before_the_budget_does() -> None:
    sched = make_scheduler(make_contract(budget=100_000, items=3, inflight=10))
    submit_all(sched, make_items([100] * 10))
    assert [len(b.items) for b in sched.dispatch(0)] == [3, 3, 3, 1]


def test_the_longest_item_sets_the_padded_length_of_the_whole_batch() -> None:
    sched = make_scheduler(make_contract(budget=4096, pad=8, inflight=10), lanes=ONE_LANE)
    items = submit_all(sched, make_items([1000, 1000, 1000, 1030]))
    first, second = sched.dispatch(0)
    assert first.items == items[:3] and first.padded_length == 1000  # 4 x 1032 would be 4128 > 4096
    assert second.items == items[3:] and second.padded_length == 1032


def test_a_batch_holds_one_model_one_shape_one_lane() -> None:
    contracts = {
        "a1": make_contract("a1", model="alpha", budget=16_384, inflight=3),
        "a2": make_contract("a2", model="alpha", budget=8192, pad=64),
        "b1": make_contract("b1", model="beta", budget=4096, items=5),
    }
    sched = make_scheduler(*contracts.values(), lanes=NARROW)
    for i in range(300):
        model = "alpha" if i % 3 else "beta"
        shape = (SHAPE_A, SHAPE_B, SHAPE_C)[i % 7 % 3]
        sched.submit(make_item(17 + (i * 7919) % 3000, shape=shape, model=model, t=i), i)
    batches = drain(sched, 300)
    for b in batches:
        assert_batch_ok(b, contracts[b.consumer])
    assert sum(len(b.items) for b in batches) == 300
    assert len({(b.model, b.shape, b.lane) for b in batches}) > 6
    sched.check()


def test_an_oversized_item_goes_alone_and_is_counted() -> None:
    sched = make_scheduler(make_contract(budget=1024, inflight=10))
    big1, big2, small = submit_all(sched, make_items([5000, 5000, 100]))
    batches = sched.dispatch(0)
    assert sorted((b.items[0].id, len(b.items), b.oversized) for b in batches) == sorted(
        [(big1.id, 1, True), (big2.id, 1, True), (small.id, 1, False)]
    )
    assert sched.oversized == 2
    assert sched.view.consumer_book("c").oversized == 2
    # their padded tokens are kept apart, so that a budget fill can leave them out (status)
    book = sched.view.consumer_book("c")
    assert book.oversized_padded_tokens == 2 * 5000
    assert book.padded_tokens - book.oversized_padded_tokens == 104
    assert sched.view.ledger_snapshot()["oversized_padded_tokens#c"] == 2 * 5000
    for b in batches:
        assert_batch_ok(b, sched.view.consumer("c").contract)


def test_submit_rejects_an_empty_item() -> None:
    sched = make_scheduler(make_contract())
    with pytest.raises(ValueError, match="length must be >= 1"):
        sched.submit(make_item(0), 0)
    assert sched.view.waiting().items == 0 and sched.view.total("received").items == 0


# ------------------------------------------------------------------------------ which lane next


def test_a_consumer_sticks_to_its_shape_then_moves_to_the_shape_with_most_waiting_tokens() -> None:
    sched = make_scheduler(make_contract(items=1, inflight=1, budget=100_000))
    submit_all(sched, make_items([100], shape=SHAPE_A))
    (first,) = sched.dispatch(0)
    assert first.shape == SHAPE_A

    submit_all(sched, make_items([100, 100], shape=SHAPE_A))  # 200 tokens
    submit_all(sched, make_items([5000, 5000], shape=SHAPE_B))  # 10,000 tokens
    submit_all(sched, make_items([3000], shape=SHAPE_C))  # 3,000 tokens
    served = []
    for now in range(1, 6):
        complete_all(sched, list(sched.in_flight_batches()), now)
        (batch,) = sched.dispatch(now)
        served.append(batch.shape)
    # A until it is empty (although B holds far more), then B (most tokens), then C.
    assert served == [SHAPE_A, SHAPE_A, SHAPE_B, SHAPE_B, SHAPE_C]
    assert sched.view.consumer("c").shape_switches == 2


def test_lanes_of_the_current_shape_are_served_round_robin() -> None:
    sched = make_scheduler(make_contract(items=1, inflight=1, budget=100_000), lanes=NARROW)
    short = submit_all(sched, make_items([100, 100, 100]))
    long = submit_all(sched, make_items([9000, 9000, 9000]))
    assert short[0].lane != long[0].lane
    order = [b.items[0].length for b in drain(sched)]
    assert order == [100, 9000, 100, 9000, 100, 9000]


def _hot_and_cold(
    max_wait_ms: int, horizon_ms: int, step_ms: int = 100, deadline: str = "overtaking"
) -> dict[str, int | None]:
    """One consumer, one batch at a time. A hot shape gets an item every step; cold items arrive once.

    Returns each cold item's wait until dispatch (None if it was never dispatched before ``horizon_ms``).
    """
    sched = make_scheduler(
        make_contract(inflight=1, budget=100_000), max_wait_ms=max_wait_ms, deadline=deadline
    )
    cold = {"B": make_item(500, shape=SHAPE_B, t=50), "C": make_item(500, shape=SHAPE_C, t=60)}
    waits: dict[str, int | None] = dict.fromkeys(cold)
    for now in range(0, horizon_ms, step_ms):
        complete_all(sched, list(sched.in_flight_batches()), now)
        sched.submit(make_item(500, shape=SHAPE_A, t=now), now)
        for batch in sched.dispatch(now):
            for name, item in cold.items():
                if item in batch.items:
                    waits[name] = now - item.arrival_ms
        if now == 0:  # the consumer is now on the hot shape; the cold items arrive behind it
            for item in cold.values():
                sched.submit(item, item.arrival_ms)
        sched.check()
    return waits


def test_without_the_deadline_a_cold_item_behind_a_hot_shape_waits_forever() -> None:
    waits = _hot_and_cold(max_wait_ms=10**9, horizon_ms=20_000)
    assert waits == {"B": None, "C": None}


@pytest.mark.parametrize("deadline", DEADLINES)
def test_the_deadline_bounds_how_long_a_cold_item_waits_behind_a_hot_shape(deadline: str) -> None:
    max_wait, step = 1000, 100
    waits = _hot_and_cold(max_wait_ms=max_wait, horizon_ms=20_000, step_ms=step, deadline=deadline)
    assert waits["B"] is not None and waits["C"] is not None
    assert max_wait <= waits["B"] <= 2 * max_wait + 2 * step
    # C is behind one older overdue shape (B): one more max_wait at most.
    assert max_wait <= waits["C"] <= 3 * max_wait + 3 * step


def test_a_small_card_never_gets_a_lane_a_bigger_card_of_its_model_can_hold() -> None:
    small = make_contract("small", budget=1024, inflight=4)
    big = make_contract("big", budget=8192, inflight=1)
    sched = make_scheduler(small, big)
    long_items = submit_all(sched, make_items([2000] * 6))
    short_items = submit_all(sched, make_items([100] * 3, shape=SHAPE_B))
    batches = sched.dispatch(0)
    by_consumer = {
        name: [it for b in batches if b.consumer == name for it in b.items] for name in ("small", "big")
    }
    assert set(by_consumer["small"]) == set(short_items)  # busy or not, big holds the long lane
    assert len(by_consumer["big"]) == 4  # 4 x 2000 in one 8192 batch; big has one slot
    assert not sched.dispatch(1)  # small has free slots, but only the long lane has work

    returned = sched.retire("big", 2)  # no live consumer fits 2000 tokens any more
    assert [len(b.items) for b in returned] == [4]
    complete_all(sched, [b for b in sched.in_flight_batches()], 3)
    batches = drain(sched, 3)
    assert sorted(it.id for b in batches for it in b.items) == sorted(it.id for it in long_items)
    assert all(b.consumer == "small" and b.oversized and len(b.items) == 1 for b in batches)
    sched.check()


def test_max_inflight_is_never_exceeded() -> None:
    sched = make_scheduler(make_contract(items=1, inflight=2))
    submit_all(sched, make_items([100] * 5))
    first = sched.dispatch(0)
    assert len(first) == 2
    assert sched.dispatch(0) == [] and sched.next_batch("c", 0) is None
    assert sched.view.consumer("c").free_slots == 0
    sched.complete(first[0].batch_id, 1)
    assert len(sched.dispatch(1)) == 1
    assert sched.next_batch("c", 1) is None


def test_consumers_take_turns_one_batch_each() -> None:
    sched = make_scheduler(make_contract("x", items=1, inflight=3), make_contract("y", items=1, inflight=3))
    submit_all(sched, make_items([100] * 4))
    assert [b.consumer for b in sched.dispatch(0)] == ["x", "y", "x", "y"]


# ------------------------------------------------------------------------------ results coming back


def test_complete_frees_the_slot_and_a_duplicate_returns_none() -> None:
    sched = make_scheduler(make_contract(inflight=1))
    submit_all(sched, make_items([100, 100]))
    (batch,) = sched.dispatch(0)
    assert sched.complete(batch.batch_id, 1) is batch
    assert sched.complete(batch.batch_id, 2) is None
    assert sched.complete("no-such-batch", 2) is None
    done = sched.view.total("completed")
    assert (done.items, done.tokens) == (2, 200)
    sched.check()


def test_complete_counts_named_failures_as_failed() -> None:
    sched = make_scheduler(make_contract(), lanes=ONE_LANE)
    ok, bad = submit_all(sched, make_items([100, 300]))
    (batch,) = sched.dispatch(0)
    sched.complete(batch.batch_id, 1, failed={bad.id})
    book = sched.view.consumer_book("c")
    assert (book.completed.items, book.completed.tokens) == (1, ok.length)
    assert (book.failed.items, book.failed.tokens) == (1, bad.length)
    sched.check()


def test_item_done_finishes_the_batch_with_its_last_item() -> None:
    sched = make_scheduler(make_contract(inflight=1))
    a, b, c = submit_all(sched, make_items([100, 100, 100]))
    (batch,) = sched.dispatch(0)
    assert sched.item_done(batch.batch_id, a.id, True, 1) is False
    assert sched.item_done(batch.batch_id, a.id, True, 1) is None  # duplicate
    assert sched.item_done(batch.batch_id, "stranger", True, 1) is None
    assert sched.item_done(batch.batch_id, b.id, False, 1) is False
    sched.check()
    assert sched.view.consumer("c").free_slots == 0
    assert sched.item_done(batch.batch_id, c.id, True, 2) is True
    assert sched.view.consumer("c").free_slots == 1
    assert sched.item_done(batch.batch_id, c.id, True, 2) is None
    assert sched.complete(batch.batch_id, 3) is None
    book = sched.view.consumer_book("c")
    assert (book.completed.items, book.failed.items, book.in_flight.items) == (2, 1, 0)
    sched.check()


def test_complete_after_some_item_done_counts_only_the_outstanding_items() -> None:
    sched = make_scheduler(make_contract(), lanes=ONE_LANE)
    a, _b, _c = submit_all(sched, make_items([100, 200, 300]))
    (batch,) = sched.dispatch(0)
    sched.item_done(batch.batch_id, a.id, True, 1)
    sched.complete(batch.batch_id, 2)
    done = sched.view.total("completed")
    assert (done.items, done.tokens) == (3, 600)
    sched.check()


def test_requeue_puts_outstanding_items_back_and_counts_them_redelivered() -> None:
    sched = make_scheduler(make_contract(inflight=1), lanes=ONE_LANE)
    items = submit_all(sched, make_items([100, 200, 300]))
    (batch,) = sched.dispatch(0)
    sched.item_done(batch.batch_id, items[0].id, True, 1)
    back = sched.requeue(batch.batch_id, 2)
    assert back == items[1:]
    assert all(not it.dispatched for it in back)
    assert sched.view.waiting().items == 2
    red = sched.view.consumer_book("c").redelivered
    assert (red.items, red.tokens) == (2, 500)
    sched.check()
    again = drain(sched, 3)
    assert Counter(it.id for b in again for it in b.items) == Counter(it.id for it in back)
    sched.check()


def test_retire_returns_the_consumers_batches_and_they_are_dispatched_again_exactly_once() -> None:
    leaving = make_contract("leaving", items=2, inflight=3)
    staying = make_contract("staying", items=2, inflight=1)
    sched = make_scheduler(leaving, staying)
    items = submit_all(sched, make_items([100] * 8))
    first = sched.dispatch(0)
    held = [b for b in first if b.consumer == "leaving"]
    assert len(held) == 3

    returned = sched.retire("leaving", 1)
    assert {b.batch_id for b in returned} == {b.batch_id for b in held}
    assert sched.view.consumer("leaving") is None
    red = sched.view.consumer_book("leaving").redelivered
    assert red.items == sum(len(b.items) for b in held) == 6
    sched.check()

    complete_all(sched, [b for b in first if b.consumer == "staying"], 2)
    rest = drain(sched, 2)
    assert all(b.consumer == "staying" for b in rest)
    dispatched_again = Counter(it.id for b in rest for it in b.items)
    assert dispatched_again == Counter(it.id for b in held for it in b.items)
    total = sched.view.total("completed")
    assert (total.items, total.tokens) == (8, sum(it.length for it in items))
    sched.check()


def test_a_changed_contract_applies_to_the_next_batch() -> None:
    sched = make_scheduler(make_contract(items=2, inflight=1))
    submit_all(sched, make_items([100] * 6))
    (first,) = sched.dispatch(0)
    sched.set_contract(make_contract(items=4, inflight=1))
    complete_all(sched, [first], 1)
    (second,) = sched.dispatch(1)
    assert (len(first.items), len(second.items)) == (2, 4)


# ------------------------------------------------------------------------------ fail-stop checks


def _batch(items: list[Item], **overrides: object) -> Batch:
    fields: dict[str, object] = {
        "batch_id": "hand-made", "consumer": "c", "model": MODEL, "shape": SHAPE_A, "lane": 0,
        "pad_multiple": 8, "padded_length": 104, "items": items, "created_ms": 0,
    }  # fmt: skip
    fields.update(overrides)
    return Batch(**fields)  # type: ignore[arg-type]


def _in_lane(item: Item, lane: int = 0) -> Item:
    item.lane = lane
    return item


@pytest.mark.parametrize(
    ("items", "overrides", "message"),
    [
        ([_in_lane(make_item(100)), _in_lane(make_item(100, shape=SHAPE_B))], {}, "shape 0xb"),
        ([_in_lane(make_item(100)), _in_lane(make_item(100), lane=1)], {}, "lane 1"),
        ([_in_lane(make_item(100)), _in_lane(make_item(100, model="other"))], {}, "model 'other'"),
        ([_in_lane(make_item(100, model="other"))], {"model": "other"}, "sent to a 'm' consumer"),
        ([_in_lane(make_item(100)) for _ in range(5)], {}, "5 items > max_items 4"),
        ([_in_lane(make_item(100)) for _ in range(2)], {"padded_length": 96}, "padded length 96"),
        ([_in_lane(make_item(600)) for _ in range(2)], {"padded_length": 600}, "1200 padded tokens > budget"),
        ([], {}, "empty"),
    ],
    ids=[
        "mixed shape",
        "mixed lane",
        "mixed model",
        "wrong model",
        "too many",
        "bad padding",
        "over budget",
        "empty",
    ],
)
def test_check_batch_rejects_a_batch_breaking_the_rule(
    items: list[Item], overrides: dict[str, object], message: str
) -> None:
    contract = make_contract(budget=1024, items=4)
    with pytest.raises(InvariantViolation, match=message):
        check_batch(_batch(items, **overrides), contract)


def test_check_batch_accepts_a_single_oversized_item() -> None:
    check_batch(
        _batch([_in_lane(make_item(5000))], padded_length=5000, oversized=True), make_contract(budget=1024)
    )


def test_dispatch_stops_rather_than_emit_a_mixed_batch() -> None:
    sched = make_scheduler(make_contract())
    (item,) = submit_all(sched, make_items([100]))
    stray = make_item(100, shape=SHAPE_B)
    stray.lane = item.lane
    sl = sched._context.table.shapes[(MODEL, SHAPE_A)]
    lane_items = sl.lanes[item.lane].items
    assert isinstance(lane_items, ByLength)
    lane_items.buckets[100].append(stray)  # corrupt the lane by hand
    lane_items.n += 1
    sl.lanes[item.lane].tokens += 100
    with pytest.raises(InvariantViolation, match=repr(stray.id)):
        sched.dispatch(0)


# ------------------------------------------------------------------------------ self-check


def test_check_detects_a_phantom_queued_item() -> None:
    sched = make_scheduler(make_contract())
    submit_all(sched, make_items([100]))
    sched.check()
    book = sched.view.model_book(MODEL)
    book.received.add(1, 50)  # the ledger believes a second item arrived and waits
    book.queued.add(1, 50)
    with pytest.raises(LedgerImbalance) as info:
        sched.check()
    assert "ledger says 2 items / 150 tokens queued, lanes hold 1 / 100" in str(info.value)


def test_check_detects_a_queued_counter_bumped_alone() -> None:
    sched = make_scheduler(make_contract())
    submit_all(sched, make_items([100]))
    sched.view.model_book(MODEL).queued.add(1, 0)
    with pytest.raises(
        LedgerImbalance,
        match=r"received\+adopted_queued\+retried 1 items / 100 tokens, "
        r"queued\+routed\+cancelled\+expired\+released_queued 2 items / 100",
    ):
        sched.check()


def test_check_detects_an_item_missing_from_an_in_flight_batch() -> None:
    sched = make_scheduler(make_contract())
    submit_all(sched, make_items([100, 100]))
    (batch,) = sched.dispatch(0)
    batch.items.pop()
    with pytest.raises(
        LedgerImbalance, match="ledger says 2 items / 200 tokens in flight, batches hold 1 / 100"
    ):
        sched.check()


def test_dispatch_settings_reject_a_zero_wait() -> None:
    with pytest.raises(ValueError, match="max_wait_ms"):
        DispatchSettings(max_wait_ms=0)


def test_scheduler_without_consumers_holds_items() -> None:
    sched = Scheduler()
    submit_all(sched, make_items([100, 200]))
    assert sched.dispatch(0) == []
    assert sched.view.waiting().items == 2
    sched.check()


@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=6),
        min_size=1,
        max_size=5,
    )
)
def test_items_done_agrees_with_item_done_one_by_one(messages: list[list[tuple[int, bool]]]) -> None:
    """Whatever results messages arrive (parts of the batch, repeats, strangers: index 5), applying
    each with ``items_done`` leaves the same ledger and slots as ``item_done`` per item."""
    twins = []
    for _ in range(2):
        sched = make_scheduler(make_contract(inflight=1))
        items = submit_all(sched, make_items([100, 101, 102, 103, 104], id=None))
        (batch,) = sched.dispatch(0)
        twins.append((sched, batch, items))
    (one, batch1, _), (many, batch2, _) = twins
    ids1 = [it.id for it in batch1.items] + ["stranger"]
    ids2 = [it.id for it in batch2.items] + ["stranger"]
    for message in messages:
        expect_applied, expect_finished = 0, False
        for index, ok in message:
            done = one.item_done(batch1.batch_id, ids1[index], ok, 1)
            expect_applied += done is not None
            expect_finished = expect_finished or bool(done)
        results = [(ids2[index], ok, False) for index, ok in message]
        assert many.items_done(batch2.batch_id, results, 1) == (expect_applied, expect_finished)
    for attr in ("completed", "failed", "in_flight"):
        a, b = getattr(one.view.consumer_book("c"), attr), getattr(many.view.consumer_book("c"), attr)
        assert (a.items, a.tokens) == (b.items, b.tokens), attr
    assert one.view.consumer("c").free_slots == many.view.consumer("c").free_slots
    one.check()
    many.check()


def test_a_whole_batch_in_one_message_finishes_it() -> None:
    sched = make_scheduler(make_contract(inflight=1))
    submit_all(sched, make_items([100, 100, 100]))
    (batch,) = sched.dispatch(0)
    results = [(it.id, i != 1, False) for i, it in enumerate(batch.items)]
    assert sched.items_done(batch.batch_id, results, 1) == (3, True)
    assert sched.items_done(batch.batch_id, results, 1) == (0, False)  # the message again
    book = sched.view.consumer_book("c")
    assert (book.completed.items, book.failed.items, book.in_flight.items) == (2, 1, 0)
    sched.check()


def test_unserved_names_models_that_wait_with_no_contract() -> None:
    sched = make_scheduler(make_contract(model="served"))
    submit_all(sched, make_items([100, 200], model="orphan") + make_items([50], model="served"))
    assert sched.unserved() == {"orphan": (2, 300)}  # "served" waits too, but has a consumer
    sched.set_contract(make_contract("d", model="orphan"))
    assert sched.unserved() == {}
    sched.retire("d", 0)
    assert sched.unserved() == {"orphan": (2, 300)}


# ------------------------------------------------------------------------------ second generation


def test_in_a_backlog_the_overtaking_deadline_costs_no_switch_and_the_absolute_one_does() -> None:
    """Everything arrives at t=0: nothing is overtaken, so the consumer drains its shape first."""
    switches = {}
    for deadline in DEADLINES:
        sched = make_scheduler(
            make_contract(items=1, inflight=1, budget=100_000), max_wait_ms=100, deadline=deadline
        )
        submit_all(sched, make_items([300], shape=SHAPE_B))  # the oldest item, in the smaller shape
        submit_all(sched, make_items([500] * 10, shape=SHAPE_A))
        served = [b.shape for b in drain(sched, step_ms=50)]
        assert sorted(served) == [SHAPE_A] * 10 + [SHAPE_B]
        switches[deadline] = sched.shape_switches
        if deadline == "overtaking":
            assert served == [SHAPE_A] * 10 + [SHAPE_B]
    assert switches == {"overtaking": 1, "absolute": 2}


def test_a_consumer_does_not_leave_its_shape_for_an_overdue_item_a_peer_on_that_shape_will_serve() -> None:
    served: dict[str, dict[str, set[int]]] = {}
    for deadline in DEADLINES:
        c1 = make_contract("c1", items=1, inflight=1, budget=100_000)
        c2 = make_contract("c2", items=1, inflight=1, budget=100_000)
        sched = make_scheduler(c1, c2, max_wait_ms=100, deadline=deadline)
        submit_all(sched, make_items([600, 500, 400, 300, 200, 100], shape=SHAPE_B))  # c1 takes B
        submit_all(sched, make_items([50], shape=SHAPE_A))  # c2 spreads to A
        shapes: dict[str, set[int]] = {"c1": set(), "c2": set()}
        for now in range(0, 600, 50):
            complete_all(sched, list(sched.in_flight_batches()), now)
            sched.submit(make_item(50, shape=SHAPE_A, t=now), now)  # A stays hot and fresh
            for b in sched.dispatch(now):
                shapes[b.consumer].add(b.shape)
            sched.check()
        served[deadline] = shapes
    assert served["overtaking"]["c2"] == {SHAPE_A}  # c1 serves all of B (then joins A)
    assert SHAPE_B in served["absolute"]["c2"]  # the first generation sent c2 to B as well


def test_a_switching_consumer_prefers_a_shape_no_other_consumer_is_on() -> None:
    for spread, expected in ((True, {SHAPE_A, SHAPE_B}), (False, {SHAPE_A})):
        c1, c2 = make_contract("c1", items=1, inflight=1), make_contract("c2", items=1, inflight=1)
        sched = make_scheduler(c1, c2, spread=spread)
        submit_all(sched, make_items([500, 500, 500], shape=SHAPE_A))
        submit_all(sched, make_items([300], shape=SHAPE_B))
        assert {b.shape for b in sched.dispatch(0)} == expected


def test_in_one_lane_a_small_card_takes_the_items_it_holds_and_leaves_the_long_ones_to_the_big_card() -> None:
    small = make_contract("small", budget=1024, inflight=4)
    big = make_contract("big", budget=8192, inflight=1)
    sched = make_scheduler(small, big)
    long_items = submit_all(sched, make_items([2000] * 4))
    short_items = submit_all(sched, make_items([100] * 3))
    assert len({it.lane for it in long_items + short_items}) == 1
    batches = drain(sched)
    by_consumer = {
        name: {it.id for b in batches if b.consumer == name for it in b.items} for name in ("small", "big")
    }
    assert by_consumer == {"small": {it.id for it in short_items}, "big": {it.id for it in long_items}}
    assert not any(b.oversized for b in batches)
    sched.check()


def test_the_deadline_cuts_an_overtaken_item_out_of_a_lane_cut_longest_first() -> None:
    """Cut by length, a short item in a lane that keeps receiving longer ones would wait for ever; the
    deadline sends it once fresher items overtake it by max_wait."""
    waits: dict[int, int | None] = {}
    for max_wait in (10**9, 1000):
        sched = make_scheduler(make_contract(items=1, inflight=1, budget=100_000), max_wait_ms=max_wait)
        short = make_item(100)
        sched.submit(short, 0)
        waits[max_wait] = None
        for now in range(0, 10_000, 100):
            complete_all(sched, list(sched.in_flight_batches()), now)
            submit_all(sched, [make_item(5000, t=now), make_item(5000, t=now)], now)
            for b in sched.dispatch(now):
                if short in b.items:
                    waits[max_wait] = now
        sched.check()
    assert waits[10**9] is None
    assert waits[1000] is not None and 1000 <= waits[1000] <= 1000 + 2 * 100
