"""Letting go of part of the scheduler's work (``Scheduler.release``): what a partial revocation of
ingest partitions does in the core. Only the picked waiting items and the named batches go; the
ledger moves exactly their counts to ``released``, per model, consumer and job; the rest dispatches
on as if nothing happened."""

from __future__ import annotations

import pytest

from processor.core.accounting import Ledger
from processor.core.item import Item
from processor.core.lanes import LaneSettings
from processor.core.scheduler import Scheduler
from tests.core.helpers import MODEL, SHAPE_A, SHAPE_B, drain, make_contract, make_scheduler


def _item(name: str, length: int, shape: int = SHAPE_A, job: str = "") -> Item:
    return Item(name, MODEL, shape, length, 0, job=job)


def _gone(item: Item) -> bool:
    """The items of "partition 1" (the one revoked): their ids start with ``p1``."""
    return item.id.startswith("p1")


def _counts(items: list[Item]) -> tuple[int, int]:
    return len(items), sum(it.length for it in items)


def _scheduler(lanes: LaneSettings | None = None) -> Scheduler:
    sched = make_scheduler(
        make_contract("a", items=2, inflight=1), make_contract("b", items=2, inflight=1), lanes=lanes
    )
    work = [
        _item("p0-1", 100, job="j"),
        _item("p1-1", 100, job="j"),
        _item("p1-2", 80, SHAPE_B),
        _item("p1-3", 80, SHAPE_B),
        _item("p0-2", 60, SHAPE_B, job="k"),
        _item("p1-4", 60, SHAPE_B, job="k"),
        _item("p0-3", 100, job="j"),
        _item("p1-5", 100, job="j"),
    ]
    for it in work:
        sched.submit(it, 0)
    return sched


@pytest.mark.parametrize("cut", ["length", "arrival"])
def test_a_partial_release_lets_go_of_exactly_the_picked_items_and_batches(cut: str) -> None:
    sched = _scheduler(LaneSettings(cut=cut))
    batches = {b.consumer: b for b in sched.dispatch(0)}
    assert set(batches) == {"a", "b"}
    let_go, stays = batches["b"], batches["a"]
    answered = let_go.items[0]
    assert sched.item_done(let_go.batch_id, answered.id, True, 1) is False  # half answered
    outstanding = [it for it in let_go.items if it is not answered]
    waiting = sched.view.waiting_list()
    gone = [it for it in waiting if _gone(it)]
    kept = [it for it in waiting if not _gone(it)]
    assert gone and kept
    before = sched.view.handover_delta()[MODEL]
    jobs_before = {
        job: (b.released_queued.items, b.released_in_flight.items) for job, b in sched.view.job_books()
    }

    assert sched.release(_gone, [let_go.batch_id, "never-here"], 2) == (len(gone), 1)

    sched.check(deep=True)  # lanes, rule 3's order, free slots and the ledger's holdings all agree
    assert {it.id for it in sched.view.waiting_list()} == {it.id for it in kept}
    assert not sched.is_in_flight(let_go.batch_id) and sched.is_in_flight(stays.batch_id)
    n, tokens = (a + b for a, b in zip(_counts(gone), _counts(outstanding), strict=True))
    assert sched.view.handover_delta()[MODEL] == (before[0] - n, before[1] - tokens)
    book = sched.view.consumer_book("b")
    assert (book.released_in_flight.items, book.released_in_flight.tokens) == _counts(outstanding)
    assert sched.view.consumer_book("a").released_in_flight.items == 0
    released_jobs = {
        job: (b.released_queued.items - jobs_before.get(job, (0, 0))[0], b.released_in_flight.items)
        for job, b in sched.view.job_books()
    }
    expected: dict[str, list[int]] = {}
    for it in gone:
        expected.setdefault(it.job, [0, 0])[0] += 1
    for it in outstanding:
        expected.setdefault(it.job, [0, 0])[1] += 1
    assert {j: c for j, c in released_jobs.items() if c != (0, 0)} == {
        j: tuple(c) for j, c in expected.items()
    }
    assert sched.handed_over(let_go.batch_id) and not sched.handed_over(stays.batch_id)
    assert sched.items_done(let_go.batch_id, [(outstanding[0].id, True, False)], 3) == (0, False)
    drain(sched, 4)
    assert sched.view.waiting().items == 0 and not list(sched.in_flight_batches())
    completed = sched.view.total("completed")
    assert completed.items == 1 + len(kept) + len(stays.items)  # the answered item, the kept ones
    sched.check(deep=True)


def test_a_shape_the_release_empties_leaves_the_order_and_its_lanes_go_quiet() -> None:
    sched = make_scheduler(make_contract("a", items=8, inflight=1))
    for it in (_item("p1-1", 100, SHAPE_B), _item("p1-2", 120, SHAPE_B), _item("p0-1", 100)):
        sched.submit(it, 0)
    ctx = sched._context
    assert set(ctx.active[MODEL]) == {(MODEL, SHAPE_A), (MODEL, SHAPE_B)}
    sched.release(_gone, (), 10)
    assert set(ctx.active[MODEL]) == {(MODEL, SHAPE_A)}  # shape B holds nothing: no longer active
    assert [it.id for it in ctx.arrivals[MODEL]] == ["p0-1"]  # released items left the arrival queue
    sched.check(deep=True)
    assert sched.tick(10 + ctx.table.settings.idle_ms) == 1  # B's emptied lane goes quiet like any
    (batch,) = sched.dispatch(20_000)
    assert [it.id for it in batch.items] == ["p0-1"]
    sched.check(deep=True)


def test_releasing_a_consumers_last_batch_frees_its_slot_for_what_is_kept() -> None:
    sched = make_scheduler(make_contract("a", items=1, inflight=1))
    for it in (_item("p1-1", 100), _item("p0-1", 100)):
        sched.submit(it, 0)
    (first,) = sched.dispatch(0)
    assert first.items[0].id == "p1-1" and sched.dispatch(1) == []  # its one slot is held
    sched.release(_gone, [first.batch_id], 2)
    (second,) = sched.dispatch(3)  # the slot is free: the kept item goes
    assert second.items[0].id == "p0-1"
    sched.check(deep=True)


def test_the_ledgers_partial_release_moves_only_what_it_is_given_and_release_all_is_it_whole() -> None:
    ledger = Ledger()
    ledger.batch_received("m", "j", 5, 500)
    ledger.batch_received("n", "", 2, 40)
    ledger.batch_routed("m", "c", "j", 3, 300, 320, False)
    ledger.check()
    ledger.check_jobs()
    whole = Ledger.restore(ledger.snapshot())

    ledger.release({("m", "j"): (1, 100)}, {("m", "c", None): (2, 200), (None, None, "j"): (2, 200)})
    ledger.check()
    ledger.check_jobs()
    m, j, c = ledger.models["m"], ledger.jobs["j"], ledger.consumers["c"]
    assert (m.queued.items, m.released_queued.items, j.queued.items, j.released_queued.items) == (1, 1, 1, 1)
    assert (m.in_flight.items, m.released_in_flight.tokens) == (1, 200)
    assert (c.in_flight.items, j.in_flight.tokens) == (1, 100)
    assert ledger.models["n"].released_queued.items == 0  # another model's waiting items stay

    whole.release_all()
    whole.check()
    whole.check_jobs()
    assert whole.handover_delta() == {"m": (-5, -500), "n": (-2, -40)}  # all of it: 2 + 3 items
    assert all(
        b.queued.items == b.in_flight.items == 0 for b in (*whole.models.values(), *whole.jobs.values())
    )
