"""Cancelled and expired jobs in the processor's loop, without a broker (processor/apps/endings.py).

Each scenario runs a real :class:`ProcessorService` over the in-memory Kafka and plays the producer,
``tokenfabric cancel`` (a ``JobShare`` record with ``cancelled_ms``) and the consumer by hand, then
reads the results topic as ``collect`` would: every item answered exactly once (by the consumer, or
by the processor with ``cancelled`` / ``expired``), and the ledger balanced with the ending counted.
"""

from __future__ import annotations

from collections import Counter

import pytest

from processor.apps.service import ProcessorService
from processor.core.shares import JobPolicy
from processor.wire.completions import decode_completions
from processor.wire.items import encode_token_item
from processor.wire.job_share import JobShareRecord, encode_job_share_record
from processor.wire.records import new_token_item
from tests.apps.service_rig import EPOCH_MS, MODEL, Pipeline, contract

JOB = "nightly"


@pytest.fixture
def p() -> Pipeline:
    return Pipeline()


def produce(p: Pipeline, ids: list[str], partition: int = 0, job: str = JOB) -> None:
    for item_id in ids:
        rec = new_token_item(item_id, MODEL, range(1, 5), 0, job_id=job, shape_components=["sys"])
        p.send(p.topics.ingest, encode_token_item(rec), item_id.encode(), partition)


def lifecycle(p: Pipeline, *, cancelled_ms: int | None = None, deadline_ms: int | None = None) -> None:
    rec = JobShareRecord(JOB, JobPolicy(), 0, cancelled_ms, deadline_ms)
    p.send(p.topics.job_shares, encode_job_share_record(rec), JOB.encode())


def results(p: Pipeline) -> dict[str, Counter[str]]:
    """Per status, how often each item was answered on the (committed) results topic."""
    out: dict[str, Counter[str]] = {}
    for _p, _o, r in p.mk.records(p.topics.results):
        for c in decode_completions(r.value):
            out.setdefault(c.status, Counter())[c.item_id] += 1
    return out


def answer_all(p: Pipeline, svc: ProcessorService, *answered: str, rounds: int = 8) -> None:
    """Step and answer every batch not ``answered`` yet, until nothing more comes."""
    done = set(answered)
    for _ in range(rounds):
        p.steps(svc, 2)
        for batch in p.batches():
            if batch.batch_id not in done:
                done.add(batch.batch_id)
                p.answer(batch)
    p.steps(svc, 2)


def once_each(p: Pipeline, ids: list[str]) -> dict[str, set[str]]:
    """Every id answered exactly once, over all statuses; the ids per status."""
    by_status = results(p)
    total: Counter[str] = sum(by_status.values(), Counter())
    assert total == Counter(dict.fromkeys(ids, 1))
    return {status: set(c) for status, c in by_status.items()}


def test_a_cancel_mid_job_ends_the_waiting_items_and_lets_the_batch_in_flight_finish(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract(items=2, inflight=1))
    ids = [f"r{n}" for n in range(10)]
    produce(p, ids)
    p.steps(svc, 3)
    (batch,) = p.batches()
    lifecycle(p, cancelled_ms=EPOCH_MS)
    p.steps(svc, 2)
    produce(p, ["late-0", "late-1"])  # still in ingest when the cancel is read: dropped as they arrive
    p.answer(batch)
    answer_all(p, svc, batch.batch_id)
    statuses = once_each(p, [*ids, "late-0", "late-1"])
    assert statuses["ok"] == {it.item_id for it in batch.items}
    assert statuses["cancelled"] == {*ids, "late-0", "late-1"} - statuses["ok"]
    book = svc.core.view.job_book(JOB)
    assert (book.cancelled.items, book.completed.items, book.queued.items) == (10, 2, 0)
    assert svc.counters.ended_items == 10 and svc.counters.unknown_completions == 0
    assert svc.snapshot().counters["cancelled_items"] == 10
    svc.core.check(deep=True)
    assert svc.ledger_error is None


def test_a_processor_killed_during_the_cancel_answers_each_item_once_after_its_restart(p: Pipeline) -> None:
    first = p.started()
    p.announce(contract(items=2, inflight=1))
    ids = [f"r{n}" for n in range(8)]
    produce(p, ids, partition=0)
    produce(p, ["s0", "s1"], partition=1)
    p.steps(first, 3)
    (batch,) = p.batches()
    lifecycle(p, cancelled_ms=EPOCH_MS)
    first.step()  # reads the cancel, answers in the open transaction, then dies before it commits
    assert first.counters.ended_items > 0 and "cancelled" not in results(p)
    second = p.started()  # the same instance id: fences the first; restores the waiting items
    p.answer(batch)
    answer_all(p, second, batch.batch_id)
    statuses = once_each(p, [*ids, "s0", "s1"])
    assert statuses["cancelled"] == {*ids, "s0", "s1"} - {it.item_id for it in batch.items}
    second.core.check(deep=True)
    third = p.started()  # and a later restart finds nothing of the job waiting: no second answer
    answer_all(p, third, *(b.batch_id for b in p.batches()))
    once_each(p, [*ids, "s0", "s1"])
    assert third.core.view.total("queued").items == 0


def test_a_restarted_processor_reads_the_cancel_before_it_dispatches(p: Pipeline) -> None:
    first = p.started()
    ids = [f"r{n}" for n in range(6)]
    produce(p, ids)
    p.steps(first, 2)  # waiting and committed; no consumer yet
    lifecycle(p, cancelled_ms=EPOCH_MS)
    p.announce(contract(items=2, inflight=4))
    second = p.started()
    answer_all(p, second)
    assert p.batches() == []
    assert once_each(p, ids) == {"cancelled": set(ids)}


def test_a_deadline_that_passes_mid_job_expires_exactly_the_items_not_yet_dispatched(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract(items=2, inflight=1))
    ids = [f"r{n}" for n in range(8)]
    produce(p, ids)
    lifecycle(p, deadline_ms=EPOCH_MS + 5_000)
    p.steps(svc, 2)  # 1.2 s: the first batch goes out
    (first,) = p.batches()
    p.answer(first)
    p.steps(svc, 2)  # 2.4 s: the second
    second = next(b for b in p.batches() if b.batch_id != first.batch_id)
    p.steps(svc, 5)  # 5.4 s: past the deadline, the second batch still in flight
    p.answer(second)
    answer_all(p, svc, first.batch_id, second.batch_id)
    dispatched = {it.item_id for b in (first, second) for it in b.items}
    statuses = once_each(p, ids)
    assert statuses == {"ok": dispatched, "expired": set(ids) - dispatched}
    assert svc.core.view.job_book(JOB).expired.items == 4
    svc.core.check(deep=True)


def test_a_share_change_after_a_cancel_does_not_revive_the_job(p: Pipeline) -> None:
    svc = p.started()
    lifecycle(p, cancelled_ms=EPOCH_MS)
    p.steps(svc, 1)
    p.send(p.topics.job_shares, None, JOB.encode())  # a tombstone: weight 1 again, still cancelled here
    p.announce(contract())
    produce(p, ["a"])
    answer_all(p, svc)
    assert once_each(p, ["a"]) == {"cancelled": {"a"}}


def test_dispatch_waits_until_the_job_shares_are_read_to_their_end_or_the_wait_runs_out(p: Pipeline) -> None:
    from processor.apps.endings import CATCH_UP_WAIT_S, SharesCatchUp

    lifecycle(p, cancelled_ms=EPOCH_MS)
    lifecycle(p, deadline_ms=EPOCH_MS)
    control = p.mk.clients().consumer({"group.id": "catch-up"})
    gate = SharesCatchUp()
    control.assign(gate.expect(control, p.topics.job_shares, [0], 0.0))
    assert not gate.ready(control, 1.0)  # nothing read yet
    gate.read(0, 0)
    assert not gate.ready(control, 1.0)  # the first of two records
    gate.read(0, 1)
    assert gate.ready(control, 1.0)
    control.assign(gate.expect(control, p.topics.job_shares, [0], 5.0))
    assert not gate.ready(control, 5.0 + CATCH_UP_WAIT_S)
    assert gate.ready(control, 5.1 + CATCH_UP_WAIT_S)  # past the wait: goes on, with a warning
    empty = SharesCatchUp()
    control.assign(empty.expect(control, p.topics.contracts, [0], 0.0))  # an empty topic: nothing to wait for
    assert empty.ready(control, 0.0)


def test_at_least_once_a_cancelled_item_is_answered_and_its_offset_may_pass(p: Pipeline) -> None:
    svc = p.started(exactly_once=False)
    lifecycle(p, cancelled_ms=EPOCH_MS)
    p.steps(svc, 1)
    produce(p, ["a", "b"])
    p.steps(svc, 3)
    assert once_each(p, ["a", "b"]) == {"cancelled": {"a", "b"}}
    assert p.mk.groups[p.topics.processor_group].committed[(p.topics.ingest, 0)] == 2


def test_with_registry_framed_results_the_processor_frames_its_own_answers(p: Pipeline) -> None:
    svc = p.started(results_schema_id=77)  # --results-framing registry
    ids = [f"r{n}" for n in range(4)]
    produce(p, ids)
    p.steps(svc, 2)  # waiting; no consumer
    lifecycle(p, cancelled_ms=EPOCH_MS)
    p.steps(svc, 2)
    values = [r.value for _p, _o, r in p.mk.records(p.topics.results)]
    assert values and all(v[:5] == b"\0\0\0\0\x4d" for v in values)  # 77 as the frame's schema id
    assert once_each(p, ids) == {"cancelled": set(ids)}
