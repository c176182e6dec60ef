"""Retries of failed items inside the pipeline (processor/core/retries.py, ``Scheduler.items_done``'s
``retriable``): a retriable failure sends the item back to its lanes as its next attempt, up to its
job's ``max_attempts``, and the ledger's equations hold after every event (``Scheduler.check``)."""

from __future__ import annotations

import pytest

from processor.core.accounting import Ledger
from processor.core.item import Item, ItemOutcome
from processor.core.retries import DEFAULT_MAX_ATTEMPTS, RetryPolicy, check_max_attempts, may_retry
from processor.core.scheduler import Scheduler
from tests.core.helpers import MODEL, make_contract


def scheduler_with(n: int, job: str = "j", items: int = 8) -> tuple[Scheduler, list[Item]]:
    sched = Scheduler()
    sched.set_contract(make_contract("c0", budget=4096, items=items, inflight=1))
    its = [Item(f"{job}-{i}", MODEL, 1, 10 + i, 0, job=job) for i in range(n)]
    sched.submit_many(its, [0] * n)
    return sched, its


def answer_all(sched: Scheduler, now: int, fail: set[str], retriable: set[str]) -> list[str]:
    """Dispatch one batch and answer it: ``fail`` fail, those also in ``retriable`` retriably."""
    (batch,) = sched.dispatch(now)
    results = [ItemOutcome(it.id, it.id not in fail) for it in batch.items]
    sched.items_done(batch.batch_id, results, now, retriable=retriable)
    sched.check()
    return [it.id for it in batch.items]


def test_the_rule_attempt_below_max_attempts() -> None:
    assert DEFAULT_MAX_ATTEMPTS == 3
    assert [may_retry(a, 3) for a in (1, 2, 3, 4)] == [True, True, False, False]
    policy = RetryPolicy()
    policy.set("once", 1)
    assert not policy.retries("once", 1) and policy.retries("other", 2)
    policy.set("once", None)
    assert policy.of("once") == 3
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="max_attempts"):
            check_max_attempts(bad)  # type: ignore[arg-type]


def test_a_retriable_failure_goes_back_to_the_lanes_and_completes_on_a_later_attempt() -> None:
    sched, its = scheduler_with(4)
    flaky = {"j-1", "j-3"}
    answer_all(sched, 0, flaky, flaky)
    again = sched.take_retried()
    assert sorted(it.id for it in again) == ["j-1", "j-3"] and all(it.attempt == 2 for it in again)
    assert sched.take_retried() == []  # taken once
    book = sched.view.job_book("j")
    assert (book.retried.items, book.queued.items, book.failed.items, book.completed.items) == (2, 2, 0, 2)
    assert book.retried.tokens == 11 + 13
    sent = answer_all(sched, 5, set(), set())  # the second attempt succeeds
    assert sorted(sent) == ["j-1", "j-3"]
    assert (book.completed.items, book.routed.items, book.failed.items) == (4, 6, 0)
    assert (
        sched.view.model_book(MODEL).retried.items == 2 and sched.view.consumer_book("c0").retried.items == 2
    )
    assert {it.id: it.attempt for it in its} == {"j-0": 1, "j-1": 2, "j-2": 1, "j-3": 2}


def test_an_item_gets_max_attempts_dispatches_then_its_failure_is_final() -> None:
    sched, its = scheduler_with(1)
    attempts = 0
    while sched.view.waiting().items:
        answer_all(sched, attempts, {"j-0"}, {"j-0"})
        attempts += 1
    assert attempts == 3 and its[0].attempt == 3
    book = sched.view.job_book("j")
    assert (book.routed.items, book.retried.items, book.failed.items) == (3, 2, 1)


def test_max_attempts_per_job_and_non_retriable_failures_are_final_at_once() -> None:
    sched, _its = scheduler_with(3)
    sched.set_max_attempts("j", 1)
    answer_all(sched, 0, {"j-0"}, {"j-0"})  # retriable, but the job allows one attempt
    assert sched.take_retried() == [] and sched.view.job_book("j").failed.items == 1
    sched2, _ = scheduler_with(3)
    answer_all(sched2, 0, {"j-0", "j-1"}, {"j-1"})  # j-0 failed for a reason not worth a retry
    assert [it.id for it in sched2.take_retried()] == ["j-1"]
    assert sched2.view.job_book("j").failed.items == 1


def test_complete_takes_retriable_too() -> None:
    sched, _its = scheduler_with(3)
    (batch,) = sched.dispatch(0)
    sched.complete(batch.batch_id, 0, failed={"j-0", "j-2"}, retriable={"j-2"})
    sched.check()
    assert [it.id for it in sched.take_retried()] == ["j-2"]
    book = sched.view.job_book("j")
    assert (book.completed.items, book.failed.items, book.retried.items, book.queued.items) == (1, 1, 1, 1)


def test_a_retried_item_of_a_cancelled_job_leaves_as_cancelled() -> None:
    sched, _its = scheduler_with(2)
    (batch,) = sched.dispatch(0)
    sched.end_job("j", "cancelled", 1)  # nothing waits: the batch in flight finishes
    sched.items_done(
        batch.batch_id, [ItemOutcome("j-0", False), ItemOutcome("j-1", True)], 2, retriable={"j-0"}
    )
    sched.check()
    assert [(it.id, e) for it, e in sched.take_ended()] == [("j-0", "cancelled")]
    book = sched.view.job_book("j")
    assert (book.retried.items, book.cancelled.items, book.queued.items) == (1, 1, 0)
    assert sched.dispatch(3) == []


def test_the_retried_counters_survive_a_checkpoint() -> None:
    sched, _its = scheduler_with(2)
    answer_all(sched, 0, {"j-0"}, {"j-0"})
    snap = sched.view.ledger_snapshot()
    assert snap["retried_items"] == 1 and snap["job:retried_items:j"] == 1
    assert snap[f"retried_items@{MODEL}"] == 1 and snap["retried_items#c0"] == 1
    restored = Ledger.restore(snap)
    restored.check()
    restored.check_jobs()
    assert restored.snapshot() == snap
    older = {k: v for k, v in snap.items() if "retried" not in k}  # a checkpoint of before: none retried
    assert Ledger.restore(older).jobs["j"].retried.items == 0


def test_a_message_answering_only_retried_items_still_counts_them_answered_and_frees_the_batch() -> None:
    sched, _its = scheduler_with(2)
    (batch,) = sched.dispatch(0)
    ok, flaky = batch.items
    assert sched.items_done(batch.batch_id, [ItemOutcome(ok.id, True)], 1) == (1, False)
    applied, finished = sched.items_done(
        batch.batch_id, [ItemOutcome(flaky.id, False)], 2, retriable={flaky.id}
    )
    assert (applied, finished) == (1, True) and not sched.is_in_flight(batch.batch_id)
    sched.check()
    (again,) = sched.dispatch(3)  # the consumer's slot is free: the retry goes out
    assert [it.id for it in again.items] == [flaky.id] and flaky.attempt == 2


def test_an_item_of_no_job_is_retried_up_to_the_default_attempts() -> None:
    """docs/wire-format.md, "Which completion of an item counts": an item with no job (``job`` "")
    has no JobShare to name its ``max_attempts``, so it gets the processors' default."""
    policy = RetryPolicy()
    policy.set("nightly", 1)
    assert [policy.retries("", n) for n in range(1, DEFAULT_MAX_ATTEMPTS + 1)] == [True, True, False]
    assert not policy.retries("nightly", 1)
