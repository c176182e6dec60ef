"""In-memory twins of broker tests that were dropped from tests/broker (docs/testing.md lists them).

Each test here carries the assertions of a broker test that only repeated, through real processes, a
behaviour of the processor's loop: the loop is the same code over ``MemoryKafka``, whose semantics
tests/kafka/contract.py checks against the broker. What needed the broker (the audit reading real
topics, SIGKILL of a real process) stays in one broker test per behaviour.

The service's numbers are read through its status snapshot (``svc.snapshot().counters``) and the
scheduler's view, never the core's private state.
"""

from __future__ import annotations

from collections import Counter

from processor.apps.service import ProcessorService
from processor.wire.control import DUPLICATE_ITEM_ID
from tests.apps.service_rig import Pipeline, contract
from tests.apps.test_service import balanced, drain
from tests.apps.test_service_retries import answer, produce

CAP = 20
LENGTH = 4  # tokens per item (Pipeline.produce)
CONSUME_BATCH = 3


def counter(svc: ProcessorService, name: str) -> int:
    return svc.snapshot().counters[name]


def test_backpressure_holds_the_backlog_in_kafka_and_every_item_completes_once_a_consumer_comes() -> None:
    """Twin of tests/broker/test_backpressure.py: past the cap the processor stops reading ingest,
    holds no more than one consume call's overshoot, drops nothing, and drains it all once a
    consumer comes."""
    p = Pipeline()
    svc = p.started(max_waiting_tokens=CAP, consume_batch=CONSUME_BATCH)
    ids = [f"i{n}" for n in range(30)]  # 120 tokens: six times the cap
    p.produce(ids)
    for _ in range(20):
        p.steps(svc, 1)
        if svc.ingest_paused:
            break
    assert svc.ingest_paused, "ingest never paused"
    p.steps(svc, 4)  # paused: nothing more comes in while no consumer drains the lanes
    waiting = svc.core.view.waiting().tokens
    assert CAP <= waiting < CAP + CONSUME_BATCH * LENGTH  # one consume call may overshoot
    assert counter(svc, "received_tokens") == waiting  # nothing dropped, nothing routed
    p.announce(contract(items=4, inflight=4))
    answered = drain(p, svc, rounds=40)
    assert answered == Counter(dict.fromkeys(ids, 1))
    assert counter(svc, "received_items") == counter(svc, "completed_items") == len(ids)
    assert svc.counters.backpressure_pauses >= 1 and not svc.ingest_paused
    balanced(svc)


def test_repeats_after_a_handover_are_dead_lettered_by_whichever_instance_owns_them_now() -> None:
    """Twin of the second test of tests/broker/test_dedupe.py: after a second instance takes half the
    partitions, every item sent again is a repeat to its new owner too (the ids travel with the
    partition), so each is dead-lettered, never dispatched twice, and both instances count some."""
    p = Pipeline(partitions=4)
    one = p.started("p0")
    p.announce(contract(items=2, inflight=8))
    ids = {part: [f"p{part}-{n}" for n in range(3)] for part in range(4)}
    for part, mine in ids.items():
        p.produce(mine, partition=part)
    first = drain(p, one)
    two = p.started("p1")
    for _ in range(3):
        p.steps(one, 1)
        p.steps(two, 1)
    assert one.owned and two.owned and one.owned | two.owned == {0, 1, 2, 3}
    for part, mine in ids.items():
        p.produce(mine, partition=part)
    drain(p, one, two)
    every = [i for mine in ids.values() for i in mine]
    dispatched = Counter(it.item_id for b in p.batches() for it in b.items)
    assert first == dispatched == Counter(dict.fromkeys(every, 1))  # the repeats never went out
    letters = p.dead_letters()
    assert [d.reason for d in letters] == [DUPLICATE_ITEM_ID] * len(every)
    assert counter(one, "duplicate_items") > 0 and counter(two, "duplicate_items") > 0
    assert counter(one, "duplicate_items") + counter(two, "duplicate_items") == len(every)
    for svc in (one, two):
        balanced(svc)


def test_at_least_once_a_processor_gone_while_a_retried_row_waits_reads_it_again() -> None:
    """Twin of the third test of tests/broker/test_retries.py: at-least-once keeps no changelog, so a
    retried row waits in memory only; its ingest offset is not committed past, and the next processor
    reads it again from ingest and completes it. Nothing is lost."""
    p = Pipeline(partitions=1)
    first = p.started(exactly_once=False)
    p.announce(contract(items=1, inflight=1))
    produce(p, ["r0", "r1", "r2"])
    p.steps(first, 3)
    (batch,) = p.batches()
    answer(p, batch, {"r0"})  # r0 fails retriably and goes back behind r1 and r2
    p.steps(first, 3)
    assert counter(first, "retried_items") == 1 and len(p.batches()) == 2  # r1 went out, r0 waits
    committed = p.mk.groups[p.topics.processor_group].committed[(p.topics.ingest, 0)]
    assert committed == 0  # r0 not answered for good: read again after a crash
    second = p.started("p0", exactly_once=False)  # the first is gone without a word
    done = {b.batch_id for b in p.batches()}
    for _ in range(12):
        p.steps(second, 2)
        for b in p.batches():
            if b.batch_id not in done:
                done.add(b.batch_id)
                answer(p, b, set())
    answered = Counter(it.item_id for b in p.batches()[1:] for it in b.items)
    assert answered["r0"] >= 1 and set(answered) >= {"r0", "r2"}  # r0 read again and run; r1 may repeat
    assert p.mk.groups[p.topics.processor_group].committed[(p.topics.ingest, 0)] == 3
