"""The processor service's loop, start, rebalances and failures, without a broker.

Each test runs a real :class:`ProcessorService` (processor/apps/service.py) over the in-memory Kafka
(processor/kafka/memory.py) and plays producers and consumer apps by hand (tests/apps/service_rig.py).
The broker tests (tests/broker/) prove the same against Kafka; these pin the service's own logic, and
every recovery test ends with each item completed exactly once and the ledger balanced.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.apps.observe import ServiceObserver
from processor.apps.service import ProcessorService
from processor.core.item import Batch
from processor.kafka.exits import DeliveryFailed, MissingTopics, Superseded, TransientFailure
from processor.kafka.memory import MemoryKafka, error
from processor.kafka.topics import TopicNames
from processor.wire.control import DUPLICATE_ITEM_ID
from tests.apps.service_rig import CARD, EPOCH_MS, MODEL, Pipeline, contract


@pytest.fixture
def p() -> Pipeline:
    return Pipeline()


def drain(p: Pipeline, *services: ProcessorService, rounds: int = 10) -> Counter[str]:
    """Step every service in turn and answer every batch, until nothing is in flight; how often each
    item was answered."""
    answered: Counter[str] = Counter()
    done: set[str] = set()
    for _ in range(rounds):
        for svc in services:
            p.steps(svc, 2)
        for batch in p.batches():
            if batch.batch_id not in done:
                done.add(batch.batch_id)
                p.answer(batch)
                answered.update(it.item_id for it in batch.items)
    for svc in services:
        p.steps(svc, 2)
    return answered


def balanced(svc: ProcessorService) -> None:
    svc.core.check(deep=True)
    assert svc.ledger_error is None


# -- start ------------------------------------------------------------------------------------


def test_start_names_every_missing_topic_and_how_to_create_them() -> None:
    mk = MemoryKafka()
    svc = ProcessorService({}, TopicNames("bare"), clients=mk.clients())
    with pytest.raises(MissingTopics, match=r"missing topic\(s\) bare\.ingest, bare\.results.*topics create"):
        svc.start()


def test_start_in_exactly_once_fences_older_sessions_before_it_subscribes(p: Pipeline) -> None:
    p.started()
    calls = p.mk.calls
    assert calls.index("init_transactions") < calls.index("subscribe")


def test_start_says_when_another_process_holds_the_instance_id(
    p: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    first = p.started()
    first.step()  # joined the group
    p.started()
    assert "the group still had a member with this id" in caplog.text


# -- the loop ---------------------------------------------------------------------------------


def test_items_become_batches_that_reach_their_consumer_when_the_transaction_commits(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract())
    svc.step()  # the first step commits at once (nothing committed yet): the contract is read
    p.produce(["a", "b", "c"])
    svc.step()  # the same instant: the eager commit is not due yet
    assert svc.counters.batches_produced == 2 and p.batches() == []  # produced, not yet committed
    p.steps(svc, 1)
    assert sorted(it.item_id for b in p.batches() for it in b.items) == ["a", "b", "c"]
    assert svc.counters.batches_delivered == 2


def test_batches_are_stamped_in_epoch_milliseconds_and_a_successor_keeps_the_same_origin(p: Pipeline) -> None:
    """``created_ms`` is epoch ms on the wire (the consumer subtracts ``produced_ms`` from it) and in
    the changelog: an instance restarted 60 s later adopts the batch with its original stamp."""
    first = p.started(wall_ms=EPOCH_MS)
    p.announce(contract(items=2, inflight=1))
    p.produce(["a", "b", "c"])
    p.steps(first, 3, ms=1_000)  # the first step restores what was assigned (paused till then)
    (batch,) = p.batches()
    assert batch.created_ms == EPOCH_MS + 2_000  # dispatched in the second step
    second = p.started(wall_ms=EPOCH_MS + 60_000)  # the same instance id: fences the first
    p.steps(second, 2)
    adopted = {b.batch_id: b for b in second.core.in_flight_batches()}
    assert adopted[batch.batch_id].created_ms == EPOCH_MS + 2_000
    assert second.now_ms() >= EPOCH_MS + 60_000


def test_completions_finish_batches_free_slots_and_balance_the_ledger(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract(inflight=1))
    p.produce(["a", "b", "c", "d"])
    answered = drain(p, svc)
    assert answered == Counter({"a": 1, "b": 1, "c": 1, "d": 1})
    assert svc.core.view.total("completed").items == 4 and svc.counters.completions == 4
    balanced(svc)


class Recording(ServiceObserver):
    """Counts each hook: dispatched and answered in items, committed and checkpointed in calls."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def committed(self, seconds: float) -> None:
        self.seen["committed"] += 1

    def checkpointed(self, seconds: float) -> None:
        self.seen["checkpointed"] += 1

    def dispatched(self, batch: Batch, now_ms: int) -> None:
        self.seen["dispatched"] += len(batch.items)

    def answered(self, batch: Batch, items: int, now_ms: int) -> None:
        self.seen["answered"] += items


def test_an_observer_set_after_the_service_is_built_hears_every_hook(p: Pipeline) -> None:
    """processor/ops/metrics.py installs its histograms after the service is built: the results
    reader must report answers to that observer too (it kept the first one: no in-flight histogram)."""
    svc = p.started()
    recording = Recording()
    svc.observer = recording
    p.announce(contract())
    p.produce(["a", "b", "c", "d"])
    drain(p, svc)
    assert recording.seen["dispatched"] == 4 and recording.seen["answered"] == 4
    assert recording.seen["committed"] > 0 and recording.seen["checkpointed"] > 0


def test_a_consumer_never_holds_more_batches_than_its_in_flight_limit(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract(items=1, inflight=2))
    p.produce([f"i{n}" for n in range(6)])
    p.steps(svc, 3)
    assert len(p.batches()) == 2
    p.answer(p.batches()[0])
    p.steps(svc, 3)
    assert len(p.batches()) == 3


def test_an_undecodable_message_is_dead_lettered_with_its_reason_and_bytes(p: Pipeline) -> None:
    svc = p.started()
    p.send(p.topics.ingest, b"not avro", b"k", 0)
    p.steps(svc, 2)
    (dl,) = p.dead_letters()
    assert dl.original == b"not avro" and dl.original_key == b"k" and dl.reason
    assert svc.counters.dead_lettered == 1 and svc.core.view.dead_lettered() == 1
    balanced(svc)


def test_a_repeated_item_id_is_dead_lettered_as_a_duplicate_and_not_scheduled(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract())
    p.produce(["same"])
    p.produce(["same"])
    p.steps(svc, 2)
    (dl,) = p.dead_letters()
    assert dl.reason == DUPLICATE_ITEM_ID and svc.counters.duplicates == 1
    assert [it.item_id for b in p.batches() for it in b.items] == ["same"]


def test_a_completion_for_an_unknown_batch_is_counted_not_applied(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract())
    p.produce(["a"])
    p.steps(svc, 2)
    (batch,) = p.batches()
    p.answer(batch)
    p.answer(batch)  # the consumer wrote it twice
    p.steps(svc, 2)
    assert svc.counters.unknown_completions == 1 and svc.core.view.total("completed").items == 1


def test_a_failed_completion_counts_as_failed_and_frees_the_slot(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract(items=1, inflight=1))
    p.produce(["a", "b"])
    p.steps(svc, 2)
    (first,) = p.batches()
    p.answer(first, ok=False)
    p.steps(svc, 2)
    assert svc.core.view.total("failed").items == 1 and len(p.batches()) == 2
    balanced(svc)


def test_a_half_answered_batch_stays_in_flight_until_its_last_item(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract(items=2, inflight=1))
    p.produce(["a", "b"])
    p.steps(svc, 2)
    (batch,) = p.batches()
    p.answer(batch, only=1)
    p.steps(svc, 2)
    assert svc.core.is_in_flight(batch.batch_id) and svc.core.done_items(batch.batch_id) == ["a"]


def test_a_retired_consumer_gives_its_batches_back_to_the_lanes(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract())
    p.produce(["a"])
    p.steps(svc, 2)
    assert svc.core.view.total("in_flight").items == 1
    p.retire(CARD)
    p.steps(svc, 2)
    assert svc.core.view.waiting().items == 1 and svc.core.view.total("in_flight").items == 0
    balanced(svc)


def test_items_of_a_model_nobody_serves_wait_and_are_reported(
    p: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    svc = p.started()
    p.announce(contract())
    p.produce(["x"], model="other")
    for _ in range(12):
        p.steps(svc, 1, ms=600)
    assert svc.core.view.waiting().items == 1 and p.batches() == []
    assert "model other: 1 items (4 tokens) wait and no consumer serves it" in caplog.text


def test_backpressure_pauses_ingest_at_the_cap_and_resumes_after_it_drains(p: Pipeline) -> None:
    svc = p.started(max_waiting_tokens=8)
    p.produce(["a", "b", "c"])  # 12 tokens, nobody serves them yet
    p.steps(svc, 2)
    assert svc.ingest_paused and svc.counters.backpressure_pauses == 1
    p.produce(["d"])
    p.steps(svc, 2)
    assert svc.counters.consumed == 3  # paused: "d" stays in Kafka
    p.announce(contract(items=4))
    drain(p, svc)
    assert not svc.ingest_paused and svc.core.view.total("completed").items == 4


def test_every_commit_checkpoints_the_ledger_with_the_services_gauges(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract())
    p.produce(["a"], partition=1)
    p.steps(svc, 2)
    last = p.checkpoints()[-1]
    assert last.counters["received_items"] == 1 and last.counters["owned_partitions"] == 2
    assert last.per_consumer[CARD]["in_flight_batches"] == 1
    assert [c.sequence for c in p.checkpoints()] == list(range(1, len(p.checkpoints()) + 1))


def test_job_shares_are_read_from_their_topic(p: Pipeline) -> None:
    from processor.core.shares import JobPolicy
    from processor.jobs.codec import encode_job_share

    p.send(p.topics.job_shares, encode_job_share("j", JobPolicy(weight=3.0), 0), b"j")
    svc = p.started()
    p.steps(svc, 1)
    assert svc.core.view.policy("j").weight == 3.0
    p.send(p.topics.job_shares, None, b"j")
    p.steps(svc, 1)
    assert svc.core.view.policy("j").weight == 1.0


# -- at-least-once ----------------------------------------------------------------------------


def test_at_least_once_delivers_at_once_and_commits_offsets_past_answered_batches(p: Pipeline) -> None:
    svc = p.started(exactly_once=False)
    p.announce(contract())
    p.produce(["a", "b"])
    p.steps(svc, 2)
    (batch,) = p.batches()
    assert svc.counters.batches_delivered == 1
    committed = p.mk.groups[p.topics.processor_group].committed
    assert committed.get((p.topics.ingest, 0), 0) == 0  # delivered, not answered: read again after a crash
    p.answer(batch)
    p.steps(svc, 2)
    assert committed[(p.topics.ingest, 0)] == 2
    assert "init_transactions" not in p.mk.calls


# -- restarts and handover --------------------------------------------------------------------


def test_a_restart_restores_waiting_and_in_flight_work_and_nothing_is_lost_or_repeated(p: Pipeline) -> None:
    first = p.started()
    p.announce(contract(items=2, inflight=1))
    p.produce([f"i{n}" for n in range(5)], partition=0)
    p.produce([f"j{n}" for n in range(3)], partition=1)
    p.steps(first, 3)
    (batch,) = p.batches()
    p.answer(batch, only=1)  # half answered when the process dies (no close: a SIGKILL)
    second = p.started()  # the same instance id: fences the first
    answered = drain(p, second)  # the consumer answers the restored batch whole: its first item again
    assert answered == Counter({f"{c}{n}": 1 for c, k in (("i", 5), ("j", 3)) for n in range(k)})
    assert second.counters.assignments == 1 and second.counters.restored_batches == 1
    # the answer written before the crash is read again by the rewound results reader; the repeat
    # of it is not counted twice (an earlier incarnation's batch: foreign, never unknown)
    assert second.core.view.total("completed").items == 8
    assert second.counters.foreign_completions + second.counters.replayed_completions == 1
    assert second.counters.unknown_completions == 0
    balanced(second)


def test_a_crash_before_the_commit_loses_the_open_transaction_whole_and_the_restart_reads_again(
    p: Pipeline,
) -> None:
    first = p.started()
    p.announce(contract())
    first.step()  # the first commit
    p.produce(["a", "b"])
    first.step()  # consumed and dispatched in the open transaction, then the process dies
    assert p.batches() == [] and first.counters.batches_produced == 1
    second = p.started()
    answered = drain(p, second)
    assert answered == Counter({"a": 1, "b": 1})
    balanced(second)


def test_two_instances_split_the_partitions_and_a_rebalance_moves_state_without_loss(p: Pipeline) -> None:
    one = p.started("p0")
    p.announce(contract(items=1, inflight=4))
    p.produce(["a", "b"], partition=0)
    p.produce(["c", "d"], partition=1)
    p.steps(one, 2)
    two = p.started("p1")
    for _ in range(3):
        p.steps(one, 1)
        p.steps(two, 1)
    assert one.owned | two.owned == {0, 1} and not one.owned & two.owned
    answered = drain(p, one, two, rounds=6)
    assert answered == Counter({"a": 1, "b": 1, "c": 1, "d": 1})
    for svc in (one, two):
        balanced(svc)


def test_a_revocation_commits_before_it_lets_go(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract())
    p.produce(["a"])
    p.steps(svc, 2)  # assigned and restored, then read and dispatched
    before = svc.counters.commits
    p.mk.rebalance(p.topics.processor_group)
    svc.step()
    assert svc.counters.commits > before and len(p.batches()) == 1  # committed while still ours


def test_a_clean_stop_commits_and_a_revocation_while_closing_does_nothing(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract())
    svc.step()
    p.produce(["a"])
    svc.step()  # dispatched in the open transaction
    svc._close(commit=True)
    assert len(p.batches()) == 1 and svc.handover.closing
    commits = svc.counters.commits
    p.mk.rebalance(p.topics.processor_group)
    svc.handover.on_revoke(None, [])
    assert svc.counters.commits == commits


# -- failures -----------------------------------------------------------------------------------


def test_a_twin_with_the_same_instance_id_makes_the_older_one_exit_superseded(p: Pipeline) -> None:
    first = p.service()
    p.announce(contract())
    p.produce(["a"])
    stop = threading.Event()
    steps = 0
    real_step = first.step

    def step() -> int:
        nonlocal steps
        steps += 1
        if steps == 2:
            p.started()  # the twin starts while the first runs
        if steps > 5:
            stop.set()
        return real_step()

    first.step = step  # type: ignore[method-assign]
    with pytest.raises(Superseded, match="a newer process with the same id took over"):
        first.run(stop)


def test_a_transaction_the_broker_aborted_after_a_pause_ends_with_a_restartable_failure(p: Pipeline) -> None:
    svc = p.service(transaction_timeout_ms=10_000)
    svc.start()
    p.announce(contract())
    p.produce(["a"])
    svc.step()
    durability = svc.mode.durability
    assert isinstance(durability.transaction_age_s(), float)
    durability._began = (durability._began[0] - 60, durability._began[1] - 60)  # type: ignore[attr-defined]
    p.mk.advance(60_000)
    p.mk.expire_transactions()
    p.clock.t += 1
    with pytest.raises(KafkaException) as caught:
        svc.step()
    assert isinstance(svc._ended_by(caught.value), TransientFailure)


def test_an_undeliverable_batch_stops_the_service_before_anything_more_commits(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract())
    p.produce(["a"])
    p.mk.fail_deliveries(p.topics.batches(CARD), error(KafkaError.MSG_SIZE_TOO_LARGE))
    with pytest.raises(DeliveryFailed):
        p.steps(svc, 2)
    assert p.batches() == []


def test_a_ledger_imbalance_is_recorded_for_health_and_raised(p: Pipeline) -> None:
    svc = p.started()
    p.announce(contract())
    p.produce(["a"])
    p.steps(svc, 2)
    book = svc.core.view.model_book(MODEL)  # a bug's footprint: an item counted that no lane holds
    book.received.add(1, 4)  # (written through the live book: no scheduler method books this)
    book.queued.add(1, 4)
    with pytest.raises(Exception, match="ledger"):
        p.steps(svc, 1)
    assert svc.ledger_error == "ledger says 1 items / 4 tokens queued, lanes hold 0 / 0"


def test_a_fatal_error_reported_on_an_ingest_message_ends_the_loop_a_transient_one_is_logged(
    p: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    svc = p.started()
    p.mk.error_message(p.topics.ingest, error(KafkaError._TRANSPORT, "broker went away"))
    svc.step()
    assert "ingest: " in caplog.text and "broker went away" in caplog.text
    p.mk.error_message(p.topics.ingest, error(KafkaError._FATAL, "fenced instance", fatal=True))
    with pytest.raises(KafkaException, match="fenced instance"):
        svc.step()


def test_a_fatal_error_on_the_control_reader_ends_the_loop(p: Pipeline) -> None:
    svc = p.started()
    p.mk.error_message(p.topics.contracts, error(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied", fatal=True))
    with pytest.raises(KafkaException, match="denied"):
        svc.step()
