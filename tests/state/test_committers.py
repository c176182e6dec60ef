"""Both delivery modes' roles (processor/state/modes.py) and every failure path of a commit, without a broker.

Driven the way the processor service drives them, over the in-memory Kafka (processor/kafka/memory.py)
with the service's client settings: what becomes visible to ``read_committed`` readers and when, what
each Kafka error does to a commit, and how the exit code classifies it (processor/kafka/exits.py). The
same paths run against a real broker in tests/broker/test_commit.py and tests/broker/test_faults.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException

from processor.kafka.exits import (
    EXIT_FAILED,
    EXIT_SUPERSEDED,
    EXIT_TEMPFAIL,
    DeliveryFailed,
    ended_by,
    exit_code,
)
from processor.kafka.memory import error
from processor.state import changelog
from processor.state.changelog_writer import ChangelogWriter
from processor.state.durability import PlainCommits, Transactions
from processor.state.lane_log import OffsetLog
from processor.state.placement import Placement
from tests.state.committing import CONSUMER, CONTRACT, TXN_TIMEOUT_MS, Rig, rig


def eo(**kwargs: object) -> tuple[Rig, Any]:
    """An exactly-once rig and its roles (typed ``Any``: tests read the concrete roles' state)."""
    r = rig(exactly_once=True, **kwargs)  # type: ignore[arg-type]
    assert isinstance(r.mode.durability, Transactions) and isinstance(r.mode.lane_log, ChangelogWriter)
    return r, r.mode


def alo() -> tuple[Rig, Any]:
    r = rig(exactly_once=False)
    assert isinstance(r.mode.durability, PlainCommits) and isinstance(r.mode.lane_log, OffsetLog)
    return r, r.mode


def exit_of(r: Rig, exc: BaseException) -> int:
    """The exit code the processor would end with (processor.apps.service._ended_by)."""
    return exit_code(
        ended_by(exc, "processor p0", r.mode.durability.transaction_age_s(), TXN_TIMEOUT_MS / 1000)
    )


# -- exactly-once: what commits, together --------------------------------------------------------


def test_start_fences_older_sessions_and_opens_a_transaction() -> None:
    r, c = eo()
    assert c.durability.in_transaction and r.mk.calls[:0] == [] and "init_transactions" in r.mk.calls
    assert r.mk.calls.index("init_transactions") < r.mk.calls.index("begin_transaction")


def test_a_batch_is_invisible_until_its_transaction_commits_then_visible_with_the_offsets() -> None:
    r, _c = eo()
    r.produce_items(0, ["a", "b"])
    r.consume()
    assert r.dispatch()
    assert r.visible(r.topics.batches(CONSUMER)) == [] and r.committed_offsets() == {}
    r.commit()
    assert len(r.visible(r.topics.batches(CONSUMER))) == 1
    assert r.committed_offsets() == {0: 2, 1: 0}
    assert r.visible(r.topics.accounting) == [(b"p0", b"checkpoint")]


def test_batches_count_as_delivered_when_their_transaction_commits_not_when_emitted() -> None:
    r, c = eo()
    r.produce_items(0, ["a", "b", "c"])
    r.consume()
    batches = r.dispatch()
    assert len(batches) == 2 and c.durability.batches_delivered == 0
    r.commit()
    assert c.durability.batches_delivered == 2
    r.commit()
    assert c.durability.batches_delivered == 2  # counted once


def test_a_waiting_item_is_logged_in_the_changelog_partition_of_its_ingest_partition() -> None:
    r, _c = eo()
    r.produce_items(1, ["w"])
    r.consume()
    r.core.release_slots()  # nothing may be dispatched: the item stays waiting
    r.commit()
    state = changelog.ChangelogState()
    for p, _o, rec in r.mk.records(r.topics.changelog):
        state.apply(rec.key, rec.value, p)
    assert list(state.waiting.items()) == [((1, 0), 1)]


def test_an_emitted_batch_leaves_the_waiting_set_and_is_logged_then_tombstoned_when_finished() -> None:
    r, c = eo()
    r.produce_items(0, ["a", "b"])
    r.consume()
    r.commit()  # both logged as waiting
    (batch,) = r.dispatch()
    r.commit()
    state = changelog.ChangelogState()
    for p, _o, rec in r.mk.records(r.topics.changelog):
        state.apply(rec.key, rec.value, p)
    assert state.waiting == {} and list(state.batches) == [batch.batch_id]
    for item in batch.items:
        r.core.item_done(batch.batch_id, item.id, True, 1)
    c.lane_log.batch_finished(batch.batch_id)
    r.commit()
    for p, _o, rec in r.mk.records(r.topics.changelog):
        state.apply(rec.key, rec.value, p)
    assert state.batches == {}


def test_items_of_a_requeued_batch_are_logged_as_waiting_again() -> None:
    r, c = eo()
    r.produce_items(0, ["a"])
    r.consume()
    (batch,) = r.dispatch()
    r.commit()
    returned = r.core.retire(CONSUMER, 5)
    assert [b.batch_id for b in returned] == [batch.batch_id]
    c.lane_log.requeued(batch.batch_id, batch.items)
    r.commit()
    state = changelog.ChangelogState()
    for p, _o, rec in r.mk.records(r.topics.changelog):
        state.apply(rec.key, rec.value, p)
    assert state.batches == {} and list(state.waiting) == [(0, 0)]


def test_due_waits_the_interval_but_commits_early_when_a_batch_waits_for_its_transaction() -> None:
    r, c = eo()
    assert c.durability.due(1_000) and not c.durability.due(1_100)
    r.produce_items(0, ["a"])
    r.consume()
    r.dispatch()
    assert not c.durability.due(1_049) and c.durability.due(1_050)  # eager_ms 50 after the last commit


def test_exactly_once_needs_a_placement_for_every_batch() -> None:
    r, c = eo()
    r.produce_items(0, ["a"])
    r.consume()
    (batch,) = r.core.dispatch(0)
    with pytest.raises(ValueError, match="needs its changelog placement"):
        c.lane_log.batch_emitted(batch, None)


def test_a_placement_takes_a_slot_and_records_where_completions_can_first_appear() -> None:
    r, c = eo()
    r.results.start_at({0: 7, 1: 3})
    r.produce_items(0, ["a"])
    r.consume()
    (batch,) = r.core.dispatch(0)
    placement = c.placement.place(batch, r.credits, CONTRACT.max_inflight, r.results)
    assert placement == Placement(0, 0, ((0, 7), (1, 3)))
    assert r.credits.held(CONSUMER) == 1


def test_slots_are_shared_by_owned_partitions_in_exactly_once_and_all_held_in_at_least_once() -> None:
    r, c = eo()
    r.credits.reassign(frozenset({0}))
    assert c.placement.slot_share(r.credits, 4) == 2
    r2, c2 = alo()
    assert c2.placement.slot_share(r2.credits, 4) is None


# -- exactly-once: failure paths ----------------------------------------------------------------


def test_an_abortable_commit_error_commits_nothing_and_a_restart_recovers() -> None:
    r, _c = eo()
    r.produce_items(0, ["a"])
    r.consume()
    r.dispatch()
    r.mk.fail_next("commit_transaction", error(KafkaError.CONCURRENT_TRANSACTIONS, abortable=True))
    with pytest.raises(KafkaException) as caught:
        r.commit()
    assert r.visible(r.topics.batches(CONSUMER)) == [] and r.committed_offsets() == {}
    assert exit_of(r, caught.value) == EXIT_TEMPFAIL


def test_a_fatal_commit_error_is_not_cured_by_a_restart() -> None:
    r, _c = eo()
    r.mk.fail_next("commit_transaction", error(KafkaError.INVALID_TXN_STATE, fatal=True))
    with pytest.raises(KafkaException) as caught:
        r.commit()
    assert exit_of(r, caught.value) == EXIT_FAILED


def test_a_commit_that_times_out_is_retriable_and_commits_nothing() -> None:
    r, _c = eo()
    r.produce_items(0, ["a"])
    r.consume()
    r.mk.fail_next("commit_transaction", error(KafkaError._TIMED_OUT, retriable=True))
    with pytest.raises(KafkaException) as caught:
        r.commit()
    assert r.visible(r.topics.accounting) == [] and exit_of(r, caught.value) == EXIT_TEMPFAIL


def test_send_offsets_failing_stops_the_commit_before_anything_commits() -> None:
    r, _c = eo()
    r.produce_items(0, ["a"])
    r.consume()
    r.mk.fail_next("send_offsets_to_transaction", error(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True))
    with pytest.raises(KafkaException):
        r.commit()
    assert "commit_transaction" not in r.mk.calls and r.committed_offsets() == {}


def test_a_young_transaction_fenced_by_a_twin_exits_superseded_and_its_work_is_aborted() -> None:
    r, _c = eo()
    r.produce_items(0, ["a"])
    r.consume()
    r.dispatch()
    twin = r.mk.clients().producer({"transactional.id": r.topics.processor_group + "-p0"})
    twin.init_transactions()
    with pytest.raises(KafkaException) as caught:
        r.commit()
    assert caught.value.args[0].code() == KafkaError._FENCED
    assert exit_of(r, caught.value) == EXIT_SUPERSEDED
    assert r.visible(r.topics.batches(CONSUMER)) == []


def test_a_fence_of_a_transaction_past_its_timeout_is_the_brokers_abort_and_a_restart_recovers() -> None:
    r, _c = eo()
    r.produce_items(0, ["a"])
    r.consume()
    r.clock.t += TXN_TIMEOUT_MS / 1000 + 1  # paused past the timeout
    r.mk.advance(TXN_TIMEOUT_MS + 1_000)
    r.mk.expire_transactions()
    with pytest.raises(KafkaException) as caught:
        r.commit()
    assert r.mode.durability.transaction_age_s() > TXN_TIMEOUT_MS / 1000
    assert exit_of(r, caught.value) == EXIT_TEMPFAIL
    assert r.visible(r.topics.changelog) == [] and r.committed_offsets() == {}


def test_a_transaction_age_is_zero_between_transactions_and_grows_with_the_clock() -> None:
    r, c = eo()
    r.clock.t += 3
    assert c.durability.transaction_age_s() == 3
    r.mk.fail_next("begin_transaction", error(KafkaError._STATE))
    with pytest.raises(KafkaException):
        r.commit()  # committed, but the next transaction could not begin
    assert not c.durability.in_transaction and c.durability.transaction_age_s() == 0.0


def test_a_failed_delivery_fails_the_commit_with_its_cause_classified() -> None:
    r, _c = eo()
    r.produce_items(0, ["a"])
    r.consume()
    r.mk.fail_deliveries(r.topics.batches(CONSUMER), error(KafkaError.MSG_SIZE_TOO_LARGE))
    r.dispatch()
    with pytest.raises(DeliveryFailed) as caught:
        r.commit()
    assert not caught.value.transient and exit_of(r, caught.value) == EXIT_FAILED
    assert r.committed_offsets() == {}


def test_a_delivery_that_timed_out_is_transient() -> None:
    r, _c = eo()
    r.produce_items(0, ["a"])
    r.consume()
    r.mk.fail_deliveries(r.topics.batches(CONSUMER), error(KafkaError._MSG_TIMED_OUT, retriable=True))
    r.dispatch()
    with pytest.raises(DeliveryFailed) as caught:
        r.commit()
    assert caught.value.transient and exit_of(r, caught.value) == EXIT_TEMPFAIL


def test_a_purged_message_is_left_for_the_commit_to_explain() -> None:
    _r, c = eo()
    c.durability.failed(KafkaError(KafkaError._PURGE_QUEUE), None)
    c.durability.check_delivered()  # the purge is an effect: no DeliveryFailed from it
    _r2, c2 = alo()
    c2.durability.failed(KafkaError(KafkaError._PURGE_QUEUE), None)
    with pytest.raises(DeliveryFailed):
        c2.durability.check_delivered()


def test_a_full_producer_queue_is_waited_out_not_raised() -> None:
    r, c = eo()
    r.mk.fail_next("produce", BufferError("Local: Queue full"), times=3)
    c.durability.produce(r.topics.dead_letter, b"dl", b"k")
    assert r.mk.calls.count("poll") >= 3
    r.commit()
    assert r.visible(r.topics.dead_letter) == [(b"k", b"dl")]


def test_a_produce_refused_after_a_failed_delivery_raises_the_delivery_failure() -> None:
    r, c = eo()
    r.mk.fail_deliveries(r.topics.dead_letter, error(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    c.durability.produce(r.topics.dead_letter, b"dl", b"k")
    r.mk.fail_next("produce", error(KafkaError._STATE, "transaction failed"))
    with pytest.raises(DeliveryFailed, match="a produce failed"):
        c.durability.produce(r.topics.dead_letter, b"dl2", b"k")


def test_a_produce_refused_with_nothing_delivered_wrong_raises_the_kafka_error() -> None:
    r, c = eo()
    r.mk.fail_next("produce", error(KafkaError._STATE, "transaction failed"))
    with pytest.raises(KafkaException, match="transaction failed"):
        c.durability.produce(r.topics.dead_letter, b"dl", b"k")


# -- exactly-once: dedupe, handover --------------------------------------------------------------


def test_a_repeated_item_id_within_the_window_is_not_first_seen_and_the_ids_are_logged() -> None:
    r, c = eo(dedupe_window_ms=60_000)
    assert c.dedupe.first_seen(0, "x") and not c.dedupe.first_seen(0, "x") and c.dedupe.first_seen(1, "x")
    assert c.dedupe.remembered_ids() == 2
    r.commit()
    state = changelog.ChangelogState()
    for p, _o, rec in r.mk.records(r.topics.changelog):
        assert rec.key is not None and rec.key.startswith(changelog.SEEN)
        state.apply(rec.key, rec.value, p)
    assert sorted(p for p, _bucket, _segment in state.seen) == [0, 1]  # each in its own partition


def test_without_a_window_every_id_is_first_seen() -> None:
    _r, c = eo()
    assert c.dedupe.first_seen(0, "x") and c.dedupe.first_seen(0, "x") and c.dedupe.remembered_ids() == 0


def test_a_revocation_lets_go_of_the_revoked_partitions_in_the_exactly_once_lane_log() -> None:
    """Which state goes (the revoked partitions', or all of it) is the handover's to say
    (tests/state/test_handover.py); the ownership hands it the lane log that holds it."""
    _r, c = eo()
    let_go: list[tuple[object, list[int]]] = []
    c.ownership.revoked([0, 1], lambda lanes, parts: let_go.append((lanes, parts)))
    assert let_go == [(c.lane_log, [0, 1])]


def test_an_assignment_restores_into_the_exactly_once_lane_log() -> None:
    _r, c = eo()
    taken: list[tuple[object, list[int]]] = []
    c.ownership.assigned([1, 0], lambda lanes, parts: taken.append((lanes, parts)))
    assert taken == [(c.lane_log, [1, 0])]


def test_exactly_once_resumes_at_start_and_reads_results_from_its_cursor() -> None:
    r, c = eo()
    resumed: list[bool] = []
    c.ownership.on_start(lambda: resumed.append(True))
    r.results.start_at({0: 4})
    assert resumed == [True]
    assigned = c.ownership.results_assignment("res", [0, 1], r.results)
    assert [(tp.topic, tp.partition, tp.offset) for tp in assigned] == [("res", 0, 4)]


# -- at-least-once ------------------------------------------------------------------------------


def test_at_least_once_uses_no_transaction_and_no_placement() -> None:
    r, c = alo()
    r.produce_items(0, ["a"])
    r.consume()
    (batch,) = r.core.dispatch(0)
    assert "init_transactions" not in r.mk.calls and c.durability.transaction_age_s() == 0.0
    assert c.placement.place(batch, r.credits, CONTRACT.max_inflight, r.results) is None
    assert r.credits.held(CONSUMER) == 0


def test_at_least_once_commits_an_offset_only_past_items_whose_batches_finished() -> None:
    r, c = alo()
    r.produce_items(0, ["a", "b", "c"])
    r.consume()
    batches = r.dispatch()
    assert len(batches) == 2
    r.commit()  # no delivery report yet: nothing is safe
    assert r.committed_offsets() == {0: 0}
    r.producer.poll(0)
    assert c.durability.batches_delivered == 2
    r.commit()  # delivered, not answered: a crash now must read them again
    assert r.committed_offsets() == {0: 0}
    first = min(batches, key=lambda b: min(it.offset for it in b.items))  # type: ignore[attr-defined]
    c.lane_log.batch_finished(first.batch_id)
    r.commit()
    assert r.committed_offsets() == {0: max(it.offset for it in first.items) + 1}  # type: ignore[attr-defined]
    for batch in batches:
        c.lane_log.batch_finished(batch.batch_id)
    r.commit()
    assert r.committed_offsets() == {0: 3}
    assert r.visible(r.topics.accounting) == [(b"p0", b"checkpoint")] * 4  # one per commit


def test_at_least_once_holds_the_offset_of_a_retried_item_until_its_later_batch_finishes() -> None:
    r, c = alo()
    r.produce_items(0, ["a"])
    (item,) = r.consume()
    (first,) = r.dispatch()
    r.producer.poll(0)
    item.attempt += 1  # what a retriable failure does (core.retries.RetryPolicy.split) ...
    item.dispatched = False
    c.in_flight.retried([item])
    c.lane_log.batch_finished(first.batch_id)  # ... before the failed batch finishes
    r.commit()
    assert r.committed_offsets() == {0: 0} and not item.safe  # in memory only: read again after a crash
    r.core.submit(item, 0)
    (second,) = r.dispatch()
    c.lane_log.batch_finished(second.batch_id)
    r.commit()
    assert r.committed_offsets() == {0: 1} and item.safe


def test_at_least_once_holds_the_offset_of_a_put_back_batch_until_it_runs_again() -> None:
    r, c = alo()
    r.produce_items(0, ["a"])
    (item,) = r.consume()
    (batch,) = r.dispatch()
    r.producer.poll(0)
    c.lane_log.requeued(batch.batch_id, batch.items)  # its consumer retired
    c.lane_log.batch_finished(batch.batch_id)  # a late answer of the put-back batch is not this item's last
    r.commit()
    assert r.committed_offsets() == {0: 0} and not item.safe


def test_at_least_once_holds_the_offset_at_an_item_whose_batch_failed_to_deliver() -> None:
    r, c = alo()
    r.produce_items(0, ["a", "b", "c"])
    r.consume()
    r.mk.fail_deliveries(r.topics.batches(CONSUMER), error(KafkaError._MSG_TIMED_OUT, retriable=True))
    r.dispatch()
    r.producer.poll(0)
    with pytest.raises(DeliveryFailed):
        c.durability.check_delivered()
    r.commit()
    assert r.committed_offsets() == {0: 0} and c.durability.batches_delivered == 0


def test_at_least_once_a_dead_letter_is_safe_once_delivered() -> None:
    r, c = alo()
    r.produce_items(0, ["a"])
    (msg,) = r.ingest.consume(1, 0)
    c.durability.produce(
        r.topics.dead_letter, b"dl", None, c.lane_log.dead_letter(msg.partition(), msg.offset())
    )
    r.commit()
    assert r.committed_offsets() == {0: 0}
    r.producer.poll(0)
    r.commit()
    assert r.committed_offsets() == {0: 1}


def test_at_least_once_an_ingest_commit_that_fails_is_retried_at_the_next_commit() -> None:
    r, c = alo()
    r.produce_items(0, ["a"])
    r.consume()
    (batch,) = r.dispatch()
    r.producer.poll(0)
    c.lane_log.batch_finished(batch.batch_id)
    r.mk.fail_next("commit", error(KafkaError.REBALANCE_IN_PROGRESS, retriable=True))
    r.commit()  # logged, not raised
    assert r.committed_offsets() == {}
    r.commit()
    assert r.committed_offsets() == {0: 1}


def test_at_least_once_a_revocation_forgets_only_the_revoked_partitions_offsets() -> None:
    r, c = alo()
    r.produce_items(0, ["a"])
    r.produce_items(1, ["b"])
    r.consume()
    for batch in r.dispatch():
        c.lane_log.batch_finished(batch.batch_id)
    r.producer.poll(0)
    let_go: list[bool] = []
    c.ownership.revoked([1], lambda: let_go.append(True))
    assert let_go == []  # lane state stays: there is no changelog to hand it over by
    assert c.lane_log.offsets.committable() == {0: 1}


def test_at_least_once_restores_nothing_and_reads_results_from_the_groups_position() -> None:
    r, c = alo()
    calls: list[object] = []
    c.ownership.assigned([0], lambda lanes, parts: calls.append(parts))
    c.ownership.on_start(lambda: calls.append("resume"))
    assert calls == []
    assigned = c.ownership.results_assignment("res", [0, 1], r.results)
    # no offset: the group's committed position (OFFSET_INVALID is "none given" to librdkafka)
    assert [(tp.topic, tp.partition, tp.offset) for tp in assigned] == [
        ("res", 0, OFFSET_INVALID),
        ("res", 1, OFFSET_INVALID),
    ]


def test_a_results_offset_commit_failure_never_fails_a_commit() -> None:
    r, c = alo()
    r.mk.fail_next("commit", error(KafkaError._NO_OFFSET))
    c.durability._commit_control()
    r2, _c2 = eo()
    r2.mk.fail_next("commit", error(KafkaError._NO_OFFSET))
    r2.commit()
    assert r2.visible(r2.topics.accounting) == [(b"p0", b"checkpoint")]
