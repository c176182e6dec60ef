"""A completion that reaches the processors while its batch's partition is handed back is booked
exactly once in the ledger, by whichever instance holds the batch when it is read, and counts as
unknown at neither: the in-memory Kafka plays the group (eager protocol, as the broker's classic one)
and the consumer's answers land before, during and after the hand-back."""

from __future__ import annotations

from collections import Counter

import pytest

from processor.apps.service import ProcessorService
from processor.wire.completions import decode_completions
from processor.wire.records import BatchRecord
from tests.apps.service_rig import Pipeline, contract

PHASES = ("before_join", "after_join", "after_old_owner_moved", "after_both_moved")


def ledger_total(p: Pipeline, key: str, instances: tuple[str, ...] = ("p0", "p1")) -> int:
    """What the audit sums: each instance's latest checkpoint."""
    return sum(p.checkpoints(i)[-1].counters.get(key, 0) for i in instances if p.checkpoints(i))


def completed_on_topic(p: Pipeline) -> Counter[str]:
    return Counter(
        c.item_id for _p, _o, r in p.mk.records(p.topics.results) for c in decode_completions(r.value)
    )


def settle(p: Pipeline, *services: ProcessorService, rounds: int = 4) -> None:
    for _ in range(rounds):
        for svc in services:
            p.steps(svc, 1)


def eight_batches_on_one_processor() -> tuple[Pipeline, ProcessorService, list[BatchRecord]]:
    """p0 alone on 2 partitions has dispatched 8 one-item batches, whose slots are spread over both
    partitions: half of them move when a second processor joins."""
    p = Pipeline(partitions=2)
    p.announce(contract(items=1, inflight=8))
    old = p.started("p0")
    p.produce([f"i{n}" for n in range(8)], partition=0)
    p.steps(old, 4)
    batches = p.batches()
    assert len(batches) == 8
    return p, old, batches


@pytest.mark.parametrize("phase", PHASES)
def test_a_completion_during_a_hand_back_is_booked_once_and_unknown_nowhere(phase: str) -> None:
    p, old, batches = eight_batches_on_one_processor()

    def answer(now: str) -> None:
        if now == phase:
            for batch in batches:
                p.answer(batch)

    answer("before_join")
    new = p.started("p1")  # joins: the next poll of each revokes and assigns
    answer("after_join")
    p.steps(old, 1)  # the old owner lets go of everything, and takes back partition 0
    answer("after_old_owner_moved")
    p.steps(new, 1)  # the new owner restores partition 1's batches
    answer("after_both_moved")
    settle(p, old, new)
    assert new.counters.restored_batches == 4
    assert completed_on_topic(p) == Counter({f"i{n}": 1 for n in range(8)})
    assert ledger_total(p, "completed_items") == 8 and ledger_total(p, "in_flight_items") == 0
    assert ledger_total(p, "routed_items") + ledger_total(p, "adopted_in_flight_items") == 8 + ledger_total(
        p, "released_in_flight_items"
    )
    assert old.counters.unknown_completions == 0 and new.counters.unknown_completions == 0
    assert old.counters.foreign_completions + old.counters.replayed_completions >= 4  # what moved
    for svc in (old, new):
        svc.core.check(deep=True)


def test_a_batch_run_again_after_its_completion_counted_is_still_unknown_after_a_hand_back() -> None:
    p, old, batches = eight_batches_on_one_processor()
    new = p.started("p1")
    settle(p, old, new)
    kept = [b for b in batches if old.core.is_in_flight(b.batch_id)]
    assert kept and len(kept) < len(batches)
    for batch in batches:
        p.answer(batch)
    settle(p, old, new)
    p.answer(kept[0])  # the consumer ran one of the batches the old owner kept a second time
    settle(p, old, new)
    assert old.counters.unknown_completions == 1 and new.counters.unknown_completions == 0
    assert ledger_total(p, "completed_items") == 8
