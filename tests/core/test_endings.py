"""Jobs that end before their items are dispatched (processor/core/endings.py): cancel and deadline.

Each scenario drives a real scheduler and checks the ledger's equations with ``Scheduler.check``
after every event, so a withdrawn item that is still counted as waiting (or not counted at all)
fails the scenario.
"""

from __future__ import annotations

import random

import pytest

from processor.core.accounting import Ledger
from processor.core.item import Item
from processor.core.scheduler import Scheduler
from tests.core.helpers import MODEL, make_contract


def job_items(job: str, n: int, t: int = 0, shapes: int = 3, seed: int = 1) -> list[Item]:
    rng = random.Random(seed)
    return [
        Item(f"{job}-{i}", MODEL, rng.randrange(shapes), rng.randint(16, 512), t, job=job) for i in range(n)
    ]


def two_jobs(n: int = 40) -> tuple[Scheduler, list[Item], list[Item]]:
    sched = Scheduler()
    sched.set_contract(make_contract("c0", budget=2048, items=8, inflight=2))
    keep, drop = job_items("keep", n), job_items("drop", n, seed=2)
    sched.submit_many(keep + drop, [0] * (2 * n))
    return sched, keep, drop


def test_cancel_mid_job_withdraws_exactly_the_waiting_items_and_in_flight_batches_finish() -> None:
    sched, _keep, drop = two_jobs()
    first = sched.dispatch(0)
    in_flight = {it.id for b in first for it in b.items if it.job == "drop"}
    n = sched.end_job("drop", "cancelled", 5)
    sched.check()
    ended = sched.take_ended()
    assert {it.id for it, _ in ended} == {it.id for it in drop} - in_flight
    assert n == len(ended) and all(e == "cancelled" for _, e in ended)
    assert sched.take_ended() == []  # taken once
    book = sched.view.job_book("drop")
    assert (book.cancelled.items, book.queued.items) == (len(ended), 0)
    assert book.cancelled.tokens == sum(it.length for it, _ in ended)
    batches = first
    while batches:  # the rest drains: the in-flight batches finish, no batch holds a cancelled item
        for b in list(sched.in_flight_batches()):
            sched.complete(b.batch_id, 10)
        sched.check()
        batches = sched.dispatch(10)
        assert not {it.id for b in batches for it in b.items} & {it.id for it, _ in ended}
    assert book.completed.items == len(in_flight)
    assert sched.view.job_book("keep").completed.items == 40


def test_items_of_an_ended_job_that_arrive_later_or_come_back_undone_leave_as_they_arrive() -> None:
    sched, _keep, _drop = two_jobs()
    batches = sched.dispatch(0)
    sched.end_job("drop", "cancelled", 1)
    sched.take_ended()
    late = job_items("drop", 5, t=2, seed=9)
    for i, it in enumerate(late):
        it.id = f"late-{i}"
    sched.submit_many(late, [2] * 5)
    sched.check()
    assert sorted(it.id for it, _ in sched.take_ended()) == sorted(it.id for it in late)
    dropped = [b for b in batches if b.items[0].job == "drop"]
    if dropped:  # a consumer that leaves returns its batch: its items end too, never go out again
        returned = sched.retire("c0", 3)
        sched.check()
        back = {it.id for it, _ in sched.take_ended()}
        assert back == {it.id for b in returned if b.items[0].job == "drop" for it in b.items}
    assert sched.view.job_book("drop").queued.items == 0


def test_a_deadline_expires_the_items_not_dispatched_by_then_and_the_first_ending_stays() -> None:
    sched, _keep, drop = two_jobs()
    sched.set_deadline("drop", 100, 0)
    assert sched.take_ended() == []
    dispatched = {it.id for b in sched.dispatch(50) for it in b.items}
    for b in list(sched.in_flight_batches()):
        sched.complete(b.batch_id, 60)
    dispatched |= {it.id for b in sched.dispatch(99) for it in b.items}
    sched.dispatch(100)  # the deadline: nothing of the job goes out from now on
    sched.check()
    expired = {it.id for it, e in sched.take_ended() if e == "expired"}
    assert expired == {it.id for it in drop} - dispatched
    assert sched.end_job("drop", "cancelled", 101) == 0  # already ended: stays expired
    assert sched.view.ended("drop") == "expired"
    assert sched.view.job_book("drop").expired.items == len(expired)
    assert sched.view.job_book("drop").cancelled.items == 0


def test_a_deadline_already_past_expires_at_once_and_a_cleared_one_never() -> None:
    sched, _keep, _drop = two_jobs()
    sched.set_deadline("keep", 10, 0)
    sched.set_deadline("keep", None, 0)
    sched.set_deadline("drop", 5, 20)
    assert {e for _, e in sched.take_ended()} == {"expired"}
    sched.dispatch(10_000)
    assert sched.view.job_book("keep").expired.items == 0
    sched.check()


def test_the_ending_stages_survive_a_checkpoint_and_a_handover() -> None:
    sched, _keep, _drop = two_jobs()
    sched.end_job("drop", "cancelled", 1)
    restored = Ledger.restore(sched.view.ledger_snapshot())
    assert restored.snapshot() == sched.view.ledger_snapshot()
    assert restored.snapshot()["cancelled_items"] == 40
    assert restored.snapshot()["job:cancelled_items:drop"] == 40
    sched.release_all()
    sched.check()
    again = job_items("drop", 3, seed=4)
    sched.adopt_waiting_many(again, [2] * 3)  # adopted from the changelog after a restart: ends too
    sched.check()
    assert len(sched.take_ended()) == 40 + 3


def test_the_ledger_refuses_an_ending_it_does_not_know_and_a_job_with_no_name() -> None:
    with pytest.raises(ValueError, match="not one of"):
        Ledger().ended(MODEL, "j", "dropped", 1, 1)
    with pytest.raises(ValueError, match="named job"):
        Scheduler().end_job("", "cancelled", 0)
