"""The consumer app's two delivery strategies (processor/apps/consumer_delivery.py) on the in-memory
Kafka: the app asks its strategy, so the same app runs transactions or plain commits by setting.
The exactly-once failure paths are in test_pipeline_in_memory.py; against a broker,
tests/broker/test_producer_consumer.py."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.apps.consumer import ConsumerApp, ConsumerSettings
from processor.apps.consumer_delivery import AtLeastOnceDelivery, TransactionalDelivery
from processor.engines.base import make_engine
from processor.kafka.memory import error
from tests.apps.service_rig import CARD, Pipeline, contract
from tests.apps.test_pipeline_in_memory import completed_items

TRANSACTIONS = {"init_transactions", "begin_transaction", "commit_transaction", "send_offsets_to_transaction"}


@pytest.fixture
def p() -> Pipeline:
    return Pipeline(consumers=())


def app(p: Pipeline, *, exactly_once: bool) -> ConsumerApp:
    settings = ConsumerSettings(idle_exit_s=0.05, poll_timeout_s=0, exactly_once=exactly_once)
    return ConsumerApp({}, p.topics, contract(), make_engine("sim", {}), settings, clients=p.mk.clients())


@pytest.mark.parametrize(
    ("exactly_once", "strategy"), [(True, TransactionalDelivery), (False, AtLeastOnceDelivery)]
)
def test_the_setting_chooses_the_strategy(p: Pipeline, exactly_once: bool, strategy: type) -> None:
    assert isinstance(app(p, exactly_once=exactly_once).delivery, strategy)


def test_an_at_least_once_app_completes_each_item_once_without_a_transaction(p: Pipeline) -> None:
    svc = p.started()
    app(p, exactly_once=False).run()
    p.produce(["a", "b", "c"])
    p.steps(svc, 3)
    p.mk.calls.clear()  # the processor's own transactions so far
    stats = app(p, exactly_once=False).run()
    assert stats.items == 3 and completed_items(p) == Counter({"a": 1, "b": 1, "c": 1})
    assert TRANSACTIONS.isdisjoint(p.mk.calls) and "commit" in p.mk.calls
    assert [r.key for _p, _o, r in p.mk.records(p.topics.contracts)] == [CARD.encode()] * 2  # one a run
    assert app(p, exactly_once=False).run().batches == 0  # the offsets were committed: nothing again


def test_an_at_least_once_commit_lost_in_a_rebalance_is_logged_and_the_batch_runs_again(
    p: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    svc = p.started()
    app(p, exactly_once=False).run()
    p.produce(["a"])
    p.steps(svc, 3)
    p.mk.fail_next("commit", error(KafkaError.REBALANCE_IN_PROGRESS))
    assert app(p, exactly_once=False).run().items == 1
    assert "the batch may run again" in caplog.text
    assert app(p, exactly_once=False).run().items == 1  # at-least-once: its completions twice
    assert completed_items(p) == Counter({"a": 2})


def test_an_at_least_once_fatal_commit_error_ends_the_app(p: Pipeline) -> None:
    svc = p.started()
    app(p, exactly_once=False).run()
    p.produce(["a"])
    p.steps(svc, 3)
    p.mk.fail_next("commit", error(KafkaError._FATAL, fatal=True))
    with pytest.raises(KafkaException):
        app(p, exactly_once=False).run()


def test_a_transactional_app_aborts_a_batch_whose_handling_fails_and_reports_the_open_time(
    p: Pipeline,
) -> None:
    svc = p.started()
    app(p, exactly_once=True).run()
    p.produce(["a"])
    p.steps(svc, 3)
    failing = app(p, exactly_once=True)
    p.mk.fail_next("send_offsets_to_transaction", error(KafkaError._TIMED_OUT, abortable=True))
    with pytest.raises(KafkaException):
        failing.run()
    assert "abort_transaction" in p.mk.calls and completed_items(p) == Counter()
    assert failing.delivery.open_for_s() > 0.0  # the aborted transaction was open: for the exit code


def test_a_batch_answered_through_an_outage_is_abandoned_without_a_call_to_the_coordinator(
    p: Pipeline,
) -> None:
    """librdkafka#5456: a consumer whose flush blocked through a 20 s freeze then blocked for ever in
    ``send_offsets_to_transaction``. Kafka went away while the batch was answered: the round ends
    before offsets or an abort reach the coordinator (the next round's ``init_transactions`` aborts
    the open transaction), and nothing of the batch is visible."""
    from processor.kafka.outage import Abandoned, is_outage

    svc = p.started()
    app(p, exactly_once=True).run()
    p.produce(["a"])
    p.steps(svc, 3)
    answering = app(p, exactly_once=True)
    seen = iter([False, True])  # no outage when the batch arrived; one by the time it is answered
    answering.stale = lambda: next(seen)
    before = len(p.mk.calls)
    with pytest.raises(Abandoned, match="Kafka went away meanwhile") as ended:
        answering.run()
    after = p.mk.calls[before:]
    assert "begin_transaction" in after and is_outage(ended.value)
    assert "send_offsets_to_transaction" not in after and "abort_transaction" not in after
    assert completed_items(p) == Counter()
    app(p, exactly_once=True).run()  # the next round: the batch again, once
    assert completed_items(p) == Counter({"a": 1})
