"""Retries of failed items in the processor's loop, without a broker (processor/core/retries.py).

A real :class:`ProcessorService` over the in-memory Kafka; the test plays the producer, the job's
``JobShare`` record (``max_attempts``) and a consumer whose engine fails some items retriably
(``ItemOutcome.retriable``): each such item comes back in a later batch until its job's attempts
are spent, and the ledger counts every retry (``retried``) and balances.
"""

from __future__ import annotations

from processor.apps.service import ProcessorService
from processor.core.shares import JobPolicy
from processor.state import changelog
from processor.wire.completions import encode_completion_batch
from processor.wire.items import encode_token_item
from processor.wire.job_share import JobShareRecord, encode_job_share_record
from processor.wire.records import BatchRecord, CompletionBatchRecord, ItemOutcomeRecord, new_token_item
from tests.apps.service_rig import MODEL, Pipeline, contract

JOB = "nightly"


def produce(p: Pipeline, ids: list[str]) -> None:
    for item_id in ids:
        rec = new_token_item(item_id, MODEL, range(1, 5), 0, job_id=JOB, shape_components=["sys"])
        p.send(p.topics.ingest, encode_token_item(rec), item_id.encode(), 0)


def answer(
    p: Pipeline, batch: BatchRecord, flaky: set[str], retriable: bool = True, only: set[str] | None = None
) -> None:
    """The consumer's completions of ``batch`` (of its items in ``only``, default all), each with its
    attempt in the batch: the items in ``flaky`` fail (retriably or not)."""
    outcomes = [
        ItemOutcomeRecord(
            item_id=it.item_id,
            status="failed" if it.item_id in flaky else "ok",
            input_tokens=it.token_count,
            reason="engine timed out" if it.item_id in flaky else None,
            retriable=retriable and it.item_id in flaky,
            attempt=batch.attempt(i),
        )
        for i, it in enumerate(batch.items)
        if only is None or it.item_id in only
    ]
    rec = CompletionBatchRecord(
        batch_id=batch.batch_id, consumer=batch.consumer, model=batch.model, completed_ms=5, items=outcomes
    )
    p.send(p.topics.results, encode_completion_batch(rec), batch.batch_id.encode(), 0)


def run(p: Pipeline, svc: ProcessorService, flaky: set[str], retriable: bool = True) -> list[list[str]]:
    """Answer every batch as it comes, until none comes; the item ids of each batch, in order."""
    done: set[str] = set()
    sent: list[list[str]] = []
    for _ in range(12):
        p.steps(svc, 2)
        for batch in p.batches():
            if batch.batch_id not in done:
                done.add(batch.batch_id)
                sent.append([it.item_id for it in batch.items])
                answer(p, batch, flaky, retriable)
    return sent


def test_a_retriable_failure_is_dispatched_again_until_the_jobs_attempts_are_spent() -> None:
    p = Pipeline()
    svc = p.started()
    p.send(
        p.topics.job_shares,
        encode_job_share_record(JobShareRecord(JOB, JobPolicy(), 0, max_attempts=2)),
        JOB.encode(),
    )
    p.announce(contract(items=4, inflight=1))
    produce(p, ["r0", "r1", "r2", "r3"])
    sent = run(p, svc, {"r1"})
    assert sorted(i for ids in sent for i in ids) == ["r0", "r1", "r1", "r2", "r3"]  # r1: its two attempts
    first, again = p.batches()
    assert (first.attempts, again.attempts) == ([], [2])  # the consumer learns r1's second attempt
    book = svc.core.view.job_book(JOB)
    assert (book.routed.items, book.retried.items, book.completed.items, book.failed.items) == (5, 1, 3, 1)
    assert svc.snapshot().counters["retried_items"] == 1
    svc.core.check(deep=True)
    assert svc.ledger_error is None


def test_a_failure_not_marked_retriable_is_final() -> None:
    p = Pipeline()
    svc = p.started()
    p.announce(contract(items=4, inflight=1))
    produce(p, ["r0", "r1"])
    sent = run(p, svc, {"r1"}, retriable=False)
    assert sorted(i for ids in sent for i in ids) == ["r0", "r1"]
    book = svc.core.view.job_book(JOB)
    assert (book.retried.items, book.failed.items) == (0, 1)


def r1_failed_once(only: set[str] | None = None) -> tuple[Pipeline, ProcessorService]:
    """A processor whose first batch, [r0, r1] (one slot), saw r1 fail retriably (``only``: the
    completions of those items alone), and the steps after."""
    p = Pipeline()
    first = p.started()
    p.announce(contract(items=4, inflight=1))
    produce(p, ["r0", "r1"])
    p.steps(first, 3)
    (batch,) = p.batches()
    answer(p, batch, {"r1"}, only=only)
    p.steps(first, 3)
    return p, first


def test_a_processor_restarted_after_a_retry_still_has_the_item_waiting() -> None:
    """Exactly-once: the retried item is logged waiting again (and then in its new batch) in the
    transaction that checkpoints its ``retried`` count, so a restart restores it once."""
    p, _first = r1_failed_once()  # r1 goes back and out again in a second batch, not answered
    assert [[it.item_id for it in b.items] for b in p.batches()][1] == ["r1"]
    second = p.started()  # fences the first; restores r1's batch in flight from the changelog
    run(p, second, set())  # answers both batches again: the first is a duplicate by now
    book = second.core.view.job_book(JOB)
    # the ledger resumes from the first's checkpoint: r0 completed there, r1 retried once, then here
    assert (book.adopted_in_flight.items, book.retried.items, book.completed.items) == (1, 1, 2)
    assert book.queued.items == book.in_flight.items == 0
    second.core.check(deep=True)


def test_a_batch_whose_only_item_is_retried_frees_its_slot() -> None:
    """One item per batch, one slot: the retry can only go out if the failed batch was finished."""
    p = Pipeline()
    svc = p.started()
    p.announce(contract(items=1, inflight=1))
    produce(p, ["r0", "r1"])
    sent = run(p, svc, {"r0"})
    assert sorted(i for ids in sent for i in ids) == ["r0", "r0", "r0", "r1"]  # r0: three attempts
    book = svc.core.view.job_book(JOB)
    assert (book.retried.items, book.failed.items, book.completed.items) == (2, 1, 1)
    svc.core.check(deep=True)


def attempts_of(p: Pipeline, item_id: str) -> list[int]:
    """The attempt of ``item_id`` in each batch that carried it, in order."""
    return [b.attempt(i) for b in p.batches() for i, it in enumerate(b.items) if it.item_id == item_id]


def live_attempt_records(p: Pipeline) -> dict[bytes, int]:
    """The changelog's ``A`` records not tombstoned (committed), by key: retried items waiting."""
    live: dict[bytes, bytes | None] = {}
    for _p, _o, rec in p.mk.records(p.topics.changelog):
        if rec.key is not None and rec.key[:1] == changelog.ATTEMPT:
            live[rec.key] = rec.value
    return {key: int.from_bytes(value, "big") for key, value in live.items() if value is not None}


def test_a_retried_item_waiting_at_a_restart_keeps_its_attempt() -> None:
    """r1 fails retriably while r0 still holds the only slot, so r1 waits, logged with its attempt
    (an ``A`` record); the restarted processor restores it on its second attempt and the third
    retriable failure is its last (max_attempts 3)."""
    p, first = r1_failed_once(only={"r1"})  # r0 outstanding: the batch keeps the slot
    assert len(p.batches()) == 1 and first.core.view.waiting().items == 1
    assert list(live_attempt_records(p).values()) == [2]  # committed with the ledger counting it
    second = p.started()  # fences the first; restores r1 waiting and r0's batch in flight
    run(p, second, {"r1"})
    assert attempts_of(p, "r1") == [1, 2, 3]
    assert live_attempt_records(p) == {}  # tombstoned as r1 went out again
    book = second.core.view.job_book(JOB)
    assert (book.retried.items, book.failed.items, book.completed.items) == (2, 1, 1)
    assert book.queued.items == book.in_flight.items == 0
    second.core.check(deep=True)


def test_a_retried_item_in_flight_at_a_restart_keeps_its_attempt() -> None:
    """r1's second attempt is in flight when the processor restarts: its batch record carries the
    attempt, so the restored batch's next retry is the third, and the last."""
    p, _first = r1_failed_once()
    assert attempts_of(p, "r1") == [1, 2]
    second = p.started()
    run(p, second, {"r1"})
    assert attempts_of(p, "r1") == [1, 2, 3]  # lost, the restored batch would read 1 and retry twice more
    book = second.core.view.job_book(JOB)
    assert (book.retried.items, book.failed.items, book.completed.items) == (2, 1, 1)
    second.core.check(deep=True)


def test_a_retried_item_handed_over_to_another_instance_keeps_its_attempt() -> None:
    """r1 waits, retried, when a second instance joins: the rebalance hands the partitions over
    through the changelog, and whichever instance restores r1 dispatches its second attempt."""
    p, one = r1_failed_once(only={"r1"})
    two = p.started("p1")
    p.announce(contract(items=4, inflight=2))  # a slot per partition, so either instance can send r1
    (first,) = p.batches()
    answer(p, first, set(), only={"r0"})  # read by whichever instance restores the batch
    answered = {first.batch_id}
    for _ in range(12):
        p.steps(one, 1)
        p.steps(two, 1)
        for batch in p.batches():
            if batch.batch_id not in answered:
                answered.add(batch.batch_id)
                answer(p, batch, set())
    assert one.owned | two.owned == {0, 1} and one.owned and two.owned
    assert attempts_of(p, "r1") == [1, 2]
    books = [svc.core.view.job_book(JOB) for svc in (one, two) if JOB in dict(svc.core.view.job_books())]
    assert sum(b.retried.items for b in books) == 1  # counted once, by the instance that retried it
    assert sum(b.completed.items for b in books) == 2 and sum(b.failed.items for b in books) == 0
    for svc in (one, two):
        svc.core.check(deep=True)
