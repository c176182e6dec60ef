"""The ACLs each role needs (processor/kafka/acls.py): derived from the pipeline's names, inside its
prefix, and shown in docs/operations.md exactly as ``tokenfabric acls`` prints them. Whether the list
is sufficient and necessary is tested against an authorizer in tests/broker/test_acls.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from processor.kafka.acls import ROLES, Acl, acls_for, distinct, render, role_acls
from processor.kafka.reader import pipeline_prefix, reader_group
from processor.kafka.topics import TopicNames, topic_specs, unisolated

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _covers(acl: Acl, name: str) -> bool:
    return name == acl.name if acl.pattern == "literal" else name.startswith(acl.name)


def test_the_docs_show_exactly_what_the_command_prints() -> None:
    text = DOCS.read_text()
    section = text.split("The pods' users need these ACLs.", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```text\n(.*?)```", section, re.S)
    assert block is not None, "docs/operations.md: no ```text block of ACLs"
    assert block.group(1) == render(acls_for(ROLES, TopicNames()), "User:<principal>")


@pytest.mark.parametrize("role", ROLES)
def test_every_acl_stays_inside_the_pipeline_and_no_other_pipeline_is_covered(role: str) -> None:
    mine, other = TopicNames("shop"), TopicNames("shop2")
    acls = role_acls(role, mine)
    assert acls, role
    others = [s.name for s in topic_specs(other, consumers=["gpu0"])] + [
        other.processor_group,
        f"{other.processor_group}-p0",
        other.consumer_group("gpu0"),
        f"{other.prefix}-reader-0a1b2c3d",
        f"{other.prefix}-collect-0a1b2c3d",
    ]
    for acl in acls:
        assert acl.name.startswith(("shop.", "shop-")), acl
        assert not any(_covers(acl, name) for name in others), acl
    assert len(distinct(acls)) == len(acls), f"{role}: an ACL listed twice"


def test_the_processor_and_consumer_acls_cover_their_own_ids() -> None:
    names = TopicNames("shop")
    processor = role_acls("processor", names, group="shop-eu")
    txn = [a for a in processor if a.resource == "transactional-id"]
    assert [a.name for a in txn] == ["shop-eu-"] and _covers(txn[0], "shop-eu-p0")
    assert any(a.resource == "group" and a.name == "shop-eu" and a.operation == "Read" for a in processor)
    consumer = role_acls("consumer", names, consumers=["gpu0"])
    own = {(a.resource, a.name, a.operation) for a in consumer}
    assert ("group", "shop-consumer-gpu0", "Read") in own
    assert ("transactional-id", "shop-consumer-gpu0", "Write") in own
    assert ("topic", "shop.batches.gpu0", "Read") in own
    assert not any(_covers(a, "shop.batches.gpu1") for a in consumer if a.operation == "Read")


def test_a_throwaway_reader_takes_a_group_id_inside_its_pipelines_prefix() -> None:
    names = TopicNames("my.shop")
    for topic in (names.ingest, names.batches("gpu.0"), names.changelog, names.jobs):
        assert pipeline_prefix(topic) == "my.shop", topic
        assert reader_group(topic).startswith("my.shop-reader-")
    readers = [a for a in role_acls("status", names) if a.resource == "group" and "-reader-" in a.name]
    assert len(readers) == 1 and _covers(readers[0], reader_group(names.contracts))


def _every_name(names: TopicNames) -> list[str]:
    """Every name a pipeline uses: topics, groups, transactional ids, throwaway readers' groups."""
    return [s.name for s in topic_specs(names, consumers=["gpu0", "x-y.z"])] + [
        names.processor_group,
        f"{names.processor_group}-p0",
        f"{names.processor_group}-control-p0",
        names.consumer_group("gpu0"),
        names.consumer_group("x-y.z"),
        f"{names.prefix}-reader-0a1b2c3d",
        f"{names.prefix}-collect-0a1b2c3d",
    ]


ISOLATED = st.text(alphabet="ab_1", min_size=1, max_size=6)  # nesting and overlapping often


@given(ISOLATED, ISOLATED)
def test_no_isolated_prefix_gains_rights_on_another_pipelines_names(mine: str, theirs: str) -> None:
    """By construction: a prefix without '.' or '-' followed by one of them starts every ACL name, so
    no ACL of one pipeline covers a name of another, however the two prefixes nest or overlap."""
    assume(mine != theirs)
    assert unisolated(mine) is None and unisolated(theirs) is None
    acls = [a for role in ROLES for a in role_acls(role, TopicNames(mine))]
    covered = [(a, n) for a in acls for n in _every_name(TopicNames(theirs)) if _covers(a, n)]
    assert not covered, covered


def test_a_nested_prefix_is_not_isolated_and_was_the_takeover() -> None:
    """carol's ``teamA-consumer``: alice's ``teamA`` consumer ACLs (prefixed ``teamA-consumer-``)
    covered carol's processors' group and transactional ids; such a prefix is now refused."""
    alice = [a for role in ROLES for a in role_acls(role, TopicNames("teamA"))]
    carol = TopicNames("teamA-consumer")
    assert any(_covers(a, f"{carol.processor_group}-p0") for a in alice if a.resource == "transactional-id")
    assert unisolated("teamA-consumer") is not None and unisolated("teamA.x") is not None
    assert unisolated("teamA") is None and unisolated("team_A1") is None
    assert "'teamA_consumer'" in (unisolated("teamA-consumer") or "")
