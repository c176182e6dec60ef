"""The processor service and a real consumer app (sim engine) over the in-memory Kafka: the whole
pipeline's protocol without a broker. The consumer app runs in turns (it exits when idle and is
started again, as a restarted pod would), so one thread drives both sides."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.apps.consumer import ConsumerApp, ConsumerAppError, ConsumerSettings, retire
from processor.engines.base import Engine, ItemResult, make_engine
from processor.kafka.memory import error
from processor.wire.completions import decode_completions
from processor.wire.records import BatchRecord, CompletionForm
from tests.apps.service_rig import CARD, MODEL, Pipeline, contract


@pytest.fixture
def p() -> Pipeline:
    return Pipeline(consumers=())  # the consumer app creates its own batch topic


def app(p: Pipeline) -> ConsumerApp:
    return ConsumerApp(
        {},
        p.topics,
        contract(),
        make_engine("sim", {}),
        ConsumerSettings(idle_exit_s=0.05, poll_timeout_s=0),
        clients=p.mk.clients(),
    )


def completed_items(p: Pipeline) -> Counter[str]:
    return Counter(
        c.item_id for _p, _o, r in p.mk.records(p.topics.results) for c in decode_completions(r.value)
    )


def test_a_consumer_creates_its_topic_before_it_announces_its_contract(p: Pipeline) -> None:
    app(p).run()
    calls = p.mk.calls
    assert p.topics.batches(CARD) in p.mk.topics
    assert calls.index("create_topics") < calls.index("commit_transaction")  # the announcement's
    assert [r.key for _p, _o, r in p.mk.records(p.topics.contracts)] == [CARD.encode()]


def test_every_item_is_completed_once_through_processor_and_consumer_app(p: Pipeline) -> None:
    svc = p.started()
    app(p).run()
    p.produce([f"i{n}" for n in range(5)])
    p.steps(svc, 3)
    stats = app(p).run()
    p.steps(svc, 3)
    assert stats.items == 5 and completed_items(p) == Counter({f"i{n}": 1 for n in range(5)})
    assert svc.core.view.total("completed").items == 5 and svc.core.view.total("in_flight").items == 0
    svc.core.check(deep=True)


def test_a_consumer_whose_commit_fails_runs_the_batch_again_and_nothing_is_counted_twice(p: Pipeline) -> None:
    svc = p.started()
    app(p).run()
    p.produce(["a", "b"])
    p.steps(svc, 3)
    p.mk.fail_next("commit_transaction", error(KafkaError.COORDINATOR_NOT_AVAILABLE, abortable=True))
    with pytest.raises(KafkaException):
        app(p).run()
    assert completed_items(p) == Counter()  # the aborted transaction's completions are never read
    app(p).run()
    p.steps(svc, 3)
    assert completed_items(p) == Counter({"a": 1, "b": 1})
    assert svc.core.view.total("completed").items == 2
    svc.core.check(deep=True)


def test_a_retired_consumers_batches_go_back_to_the_lanes(p: Pipeline) -> None:
    svc = p.started()
    app(p).run()
    p.produce(["a"])
    p.steps(svc, 3)
    retire({}, p.topics, CARD, clients=p.mk.clients())
    p.steps(svc, 2)
    assert svc.core.view.waiting().items == 1 and svc.core.view.total("in_flight").items == 0


def test_a_consumer_that_cannot_reach_kafka_says_so_in_one_line(p: Pipeline) -> None:
    p.mk.fail_next("list_topics", error(KafkaError._TRANSPORT, "connection refused"))
    with pytest.raises(ConsumerAppError, match=r"cannot reach Kafka at \? within"):
        app(p).ensure_topic(timeout_s=0.1)


class _CachingEngine(Engine):
    """Serves all but the last prompt token of every item from its "cache"."""

    name = "caching"

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        return [ItemResult(it.item_id, "ok", b"x", 1, None, True, it.token_count - 1) for it in batch.items]


@pytest.mark.parametrize("form", ["batch", "item"])
def test_the_ledger_counts_the_prompt_tokens_the_consumers_report_cached(
    p: Pipeline, form: CompletionForm
) -> None:
    svc = p.started()
    caching = ConsumerApp(
        {}, p.topics, contract(), _CachingEngine(),
        ConsumerSettings(idle_exit_s=0.05, poll_timeout_s=0, completions=form),
        clients=p.mk.clients(),
    )  # fmt: skip
    caching.run()
    p.produce([f"i{n}" for n in range(5)])
    p.steps(svc, 3)
    caching.run()
    p.steps(svc, 3)
    view = svc.core.view
    completed = view.total("completed")
    assert completed.items == 5
    assert view.prompts_counted()
    assert view.model_book(MODEL).cached_prompt_tokens == completed.tokens - 5
    assert view.consumer_book(CARD).prefill_tokens == 5
    assert view.job_book("").cached_prompt_tokens == completed.tokens - 5
    assert view.ledger_snapshot()["cached_prompt_tokens"] == completed.tokens - 5
    svc.core.check(deep=True)
