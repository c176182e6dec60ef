"""The scheduler across a partition handover: slots released until a contract gives them back, and
in-flight batches adopted from the changelog (their consumer still there, or gone)."""

from __future__ import annotations

from processor.core.item import NO_LANE, Batch, Item
from processor.core.scheduler import Scheduler
from tests.core.helpers import (
    MODEL,
    SHAPE_A,
    complete_all,
    make_contract,
    make_items,
    make_scheduler,
    submit_all,
)
from tests.core.test_scheduler import NARROW

# ------------------------------------------------------------------------------ partition handover


def test_release_slots_stops_every_consumer_until_a_contract_gives_it_a_share_again() -> None:
    sched = make_scheduler(make_contract("a", items=1, inflight=4), make_contract("b", items=1, inflight=4))
    submit_all(sched, make_items([100] * 12))
    assert len(sched.dispatch(0)) == 8
    complete_all(sched, list(sched.in_flight_batches()), 1)

    sched.release_slots()
    assert sched.dispatch(2) == []  # items wait, but no consumer holds a slot here
    assert sched.view.waiting().items == 4
    assert set(sched.view.consumers()) == {"a", "b"}  # the contracts stay

    sched.set_contract(make_contract("a", items=1, inflight=4), slots=1)
    batches = sched.dispatch(3)
    assert [b.consumer for b in batches] == ["a"]  # only the share given back, only to "a"
    sched.check()


def _rebuilt(batch: Batch) -> Batch:
    """``batch`` as a restore rebuilds it: fresh items, neither dispatched nor in a lane."""
    items = [Item(it.id, it.model, it.shape, it.length, it.arrival_ms) for it in batch.items]
    return Batch(
        batch.batch_id,
        batch.consumer,
        batch.model,
        batch.shape,
        batch.lane,
        batch.pad_multiple,
        batch.padded_length,
        items,
        batch.created_ms,
        batch.oversized,
    )


def test_adopt_in_flight_marks_the_batch_items_dispatched_in_its_lane() -> None:
    sched = make_scheduler(make_contract(items=3, inflight=1), lanes=NARROW)
    submit_all(sched, make_items([100, 400, 900, 100, 104]))
    (emitted,) = sched.dispatch(0)
    sched.release_all()

    batch = _rebuilt(emitted)
    assert not any(it.dispatched for it in batch.items) and {it.lane for it in batch.items} == {NO_LANE}
    assert sched.adopt_in_flight(batch, 1, done={batch.items[0].id})
    assert all(it.dispatched and it.lane == emitted.lane for it in batch.items)  # answered ones too
    sched.check(deep=True)

    again = Scheduler()  # items already marked stay as they are
    again.set_contract(make_contract(items=3, inflight=1))
    assert again.adopt_in_flight(batch, 1)
    assert all(it.dispatched and it.lane == emitted.lane for it in batch.items)
    again.check(deep=True)


def test_adopting_a_batch_whose_consumer_is_gone_puts_its_items_back_as_waiting() -> None:
    sched = make_scheduler(make_contract("gone", items=2, inflight=1))
    submit_all(sched, make_items([100, 100]))
    batch = _rebuilt(sched.dispatch(0)[0])

    other = make_scheduler(make_contract("alive"))
    assert not other.adopt_in_flight(batch, 2)
    assert not any(it.dispatched for it in batch.items)  # waiting again, in the lane they joined
    assert {it.lane for it in batch.items} == {
        lane.id for lane in other._context.table.shapes[(MODEL, SHAPE_A)].lanes.values()
    }
    assert other.oldest_waiting_ms(MODEL, 10) == 0  # by their arrival, not the restore
    other.check(deep=True)


def test_a_batch_let_go_at_a_hand_back_is_known_as_handed_over_until_it_comes_back() -> None:
    sched = make_scheduler(make_contract(items=1, inflight=2))
    submit_all(sched, make_items([100, 100]))
    first, second = sched.dispatch(0)
    assert sched.made_here(first.batch_id) and not sched.made_here(f"x{first.batch_id}")
    assert not sched.handed_over(first.batch_id)
    sched.release_all()
    assert sched.handed_over(first.batch_id) and sched.handed_over(second.batch_id)
    # its completion reaching this scheduler now applies nothing: the adopting instance books it
    assert sched.items_done(first.batch_id, [(first.items[0].id, True, False)], 1) == (0, False)
    assert sched.view.total("completed").items == 0
    assert sched.adopt_in_flight(_rebuilt(second), 2)  # it came back: held, not handed over
    assert not sched.handed_over(second.batch_id) and sched.handed_over(first.batch_id)
    assert sched.items_done(second.batch_id, [(second.items[0].id, True, False)], 3) == (1, True)
    assert not sched.handed_over(second.batch_id)  # finished here, so a late repeat is unknown
    sched.check(deep=True)


def test_dispatch_looks_only_at_consumers_with_a_free_slot_and_keeps_their_turns() -> None:
    sched = make_scheduler(*(make_contract(c, items=1, inflight=1) for c in "abc"))
    submit_all(sched, make_items([100] * 12))
    assert [b.consumer for b in sched.dispatch(0)] == ["a", "b", "c"]
    assert sched.dispatch(1) == []  # every slot held: nobody to look at
    held = {b.consumer: b for b in sched.in_flight_batches()}
    sched.complete(held["c"].batch_id, 2)
    sched.complete(held["a"].batch_id, 2)
    assert [b.consumer for b in sched.dispatch(3)] == ["a", "c"]  # announce order, not answer order
    sched.set_contract(make_contract("b", items=1, inflight=2))  # a larger contract frees a slot
    assert [b.consumer for b in sched.dispatch(4)] == ["b"]
    sched.retire("a", 5)
    sched.release_slots()
    assert sched.dispatch(6) == []
    sched.set_contract(make_contract("c", items=1, inflight=3), slots=2)
    assert [b.consumer for b in sched.dispatch(7)] == ["c"]
    sched.check(deep=True)  # which consumers have a free slot is what dispatch keeps
