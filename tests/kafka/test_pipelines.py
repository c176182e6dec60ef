"""``check_pipeline``: which prefixes a cluster holds, and the refusal for one it does not."""

from __future__ import annotations

import pytest

from processor.kafka.config import ConfigError
from processor.kafka.memory import MemoryClients, MemoryKafka
from processor.kafka.pipelines import (
    NAMED_PREFIXES,
    NoSuchPipeline,
    check_pipeline,
    pipeline_prefixes,
    refuse_new_nested_pipeline,
)
from processor.kafka.topics import TopicNames, topic_specs

CONF = {"bootstrap.servers": "memory:9092"}


def test_a_prefix_is_a_pipeline_when_its_ingest_topic_exists() -> None:
    assert pipeline_prefixes(["a.ingest", "a.results", "b.results", ".ingest", "c.d.ingest"]) == ["a", "c.d"]


def test_an_existing_pipeline_passes_and_a_typo_names_the_prefixes_there() -> None:
    kafka = MemoryKafka()
    kafka.create_topics(topic_specs(TopicNames("orders")))
    kafka.create_topics(topic_specs(TopicNames("reviews")))
    clients = MemoryClients(kafka)
    check_pipeline(CONF, TopicNames("orders"), clients)
    with pytest.raises(NoSuchPipeline) as refused:
        check_pipeline(CONF, TopicNames("order"), clients)
    assert str(refused.value) == (
        "--topic-prefix 'order': no pipeline on memory:9092 (no topic order.ingest); "
        "did you mean orders? (pass that --topic-prefix)"
    )


def test_a_new_prefix_far_from_every_other_names_them_and_how_to_create_it() -> None:
    kafka = MemoryKafka()
    kafka.create_topics(topic_specs(TopicNames("orders")))
    clients = MemoryClients(kafka)
    with pytest.raises(NoSuchPipeline) as refused:
        create = "tokenfabric local up --topic-prefix invoices"
        check_pipeline(CONF, TopicNames("invoices"), clients, create=create)
    assert str(refused.value) == (
        "--topic-prefix 'invoices': no pipeline on memory:9092 (no topic invoices.ingest; prefixes there: "
        "orders); to start a new one: 'tokenfabric local up --topic-prefix invoices'"
    )


def test_on_a_busy_cluster_only_the_nearest_prefixes_are_named() -> None:
    kafka = MemoryKafka()
    for n in range(NAMED_PREFIXES * 3):
        kafka.create_topics(topic_specs(TopicNames(f"team{n:02d}")))
    kafka.create_topics(topic_specs(TopicNames("reviews-prod")))
    with pytest.raises(NoSuchPipeline) as refused:
        check_pipeline(CONF, TopicNames("reviews-prd"), MemoryClients(kafka))
    assert "did you mean reviews-prod?" in str(refused.value)
    with pytest.raises(NoSuchPipeline) as refused:
        check_pipeline(CONF, TopicNames("zzz"), MemoryClients(kafka))
    assert f"{NAMED_PREFIXES * 3 + 1} prefixes there, the nearest: " in str(refused.value)


def test_a_cluster_with_no_pipeline_says_so() -> None:
    with pytest.raises(NoSuchPipeline, match=r"no topic x\.ingest; it holds no pipeline yet\)"):
        check_pipeline(CONF, TopicNames("x"), MemoryClients(MemoryKafka()))


def test_a_new_pipeline_needs_an_isolated_prefix_and_an_old_one_keeps_working() -> None:
    kafka = MemoryKafka()
    clients = MemoryClients(kafka)
    with pytest.raises(ConfigError, match="not isolated"):
        refuse_new_nested_pipeline(CONF, TopicNames("team-a"), clients)
    refuse_new_nested_pipeline(CONF, TopicNames("team_a"), clients)
    kafka.create_topic("team-a.ingest", 1, {})  # made before prefixes had to be isolated
    refuse_new_nested_pipeline(CONF, TopicNames("team-a"), clients)


def test_a_missing_pipeline_on_a_cluster_without_an_authorizer_is_still_missing() -> None:
    clients = MemoryClients(MemoryKafka())
    with pytest.raises(NoSuchPipeline):
        check_pipeline(CONF, TopicNames("order"), clients)
