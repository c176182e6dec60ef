"""``tokenfabric acls`` against a broker that enforces ACLs: every ACL it prints is necessary, and
two pipelines under two principals are kept out of each other's topics, groups and transactional ids.

Sufficiency is the pipeline of tests/broker/test_security.py (every role under only its printed
ACLs, clean audit). Here each ACL is taken away in turn from a principal that holds the rest of its
role's list, and the smallest operation that needs it (a read, a write, a commit under the group, an
offsets lookup, ``init_transactions`` under the transactional id, a topic creation) is refused with
the one line of processor.kafka.exits.refusal, naming the resource; with the whole list the same
operation succeeds. The secured broker is test_security.py's session fixture.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException

from processor.kafka.acls import ROLES, Acl, acls_for, reader_group_prefix, role_acls
from processor.kafka.exits import Refused, refusal
from processor.kafka.factory import KAFKA
from processor.kafka.reader import partitions_of, read_topic
from processor.kafka.topics import TopicNames, TopicSpec, create_topics, topic_specs
from processor.local.broker import BrokerInfo
from processor.local.secure import TLS
from tests.broker.rig import CARDS
from tests.broker.test_security import grant, new_pipeline, revoke, secured

pytestmark = pytest.mark.kafka

__all__ = ["secured"]  # the session fixture, imported to be found here

CARD = CARDS[0].consumer


def _concrete(acl: Acl) -> str:
    """A name the ACL covers: itself when literal, itself plus a suffix when prefixed."""
    return acl.name if acl.pattern == "literal" else f"{acl.name}probe{uuid.uuid4().hex[:4]}"


def _readable_topic(acl: Acl, names: TopicNames) -> str:
    """A topic the role reads, to commit offsets on under the group ``acl`` covers."""
    if acl.name.startswith(names.consumer_group("")):
        return names.batches(CARD)
    if "-control-" in acl.name:
        return names.results
    return names.ingest


def operation_needing(
    acl: Acl,
    names: TopicNames,
    conf: dict[str, str],
    readable: str | None = None,
    member_of: str | None = None,
) -> Callable[[], None]:
    """The smallest operation that needs ``acl``, as the role does it; raises :class:`Refused`.
    ``readable``: a topic the role reads (the throwaway readers' group ACL is needed to read it);
    ``member_of``: the group a role that reads only as a group member (a consumer app) reads in."""
    name = _concrete(acl)
    if acl.resource == "topic" and acl.name == names.batches(""):
        name = names.batches(CARD)

    def refuse(exc: BaseException, **where: str) -> None:
        refused = refusal(exc, conf, **where)  # type: ignore[arg-type]
        if refused is None:
            raise exc
        raise refused from None

    def read(topic: str = name) -> None:
        if member_of is not None:
            consume_in_group(topic, member_of)
        else:
            list(read_topic(conf, topic, timeout_s=10))

    def consume_in_group(topic: str, group: str) -> None:
        """Subscribe under ``group`` until the topic's record arrives (allowed) or an error says why not."""
        consumer = KAFKA.consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 20
            while True:
                assert time.monotonic() < deadline, f"nothing read from {topic} under {group}"
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error() is not None:
                    where = {**conf, "group.id": group}
                    refused = refusal(KafkaException(msg.error()), where, operation="Read", topic=topic)
                    if refused is None:
                        raise KafkaException(msg.error())
                    raise refused
                return
        finally:
            consumer.close()

    def write() -> None:
        errors: list[object] = []
        producer = KAFKA.producer({**conf, "message.timeout.ms": "10000"})
        topic = name
        producer.produce(topic, b"probe", b"probe", on_delivery=lambda err, _msg: errors.append(err))
        producer.flush(15)
        if errors and errors[0] is not None:
            refuse(KafkaException(errors[0]), operation="Write", topic=topic)

    def describe_topic() -> None:
        consumer = KAFKA.consumer({**conf, "group.id": f"{names.prefix}-reader-probe"})
        try:
            partitions_of(consumer, name)
        except KafkaException as exc:
            refuse(exc, operation="Describe", topic=name)
        finally:
            consumer.close()

    def create() -> None:
        try:
            create_topics(conf, [TopicSpec(f"{names.prefix}.probe-{uuid.uuid4().hex[:6]}", 1, {})], 15)
        except KafkaException as exc:
            refuse(exc, operation="Create", resource=f"topic '{names.prefix}.probe-*'")

    def join_group() -> None:
        """Subscribe under the group until it assigns a partition (allowed) or says why not."""
        consumer = KAFKA.consumer({**conf, "group.id": name, "enable.auto.commit": "false"})
        try:
            consumer.subscribe([_readable_topic(acl, names)])
            deadline = time.monotonic() + 20
            while not consumer.assignment():
                assert time.monotonic() < deadline, f"no answer joining {name}"
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is not None:
                    refuse(KafkaException(msg.error()), operation="Read", resource=f"group '{name}'")
        finally:
            consumer.close()

    def describe_group() -> None:
        admin = KAFKA.admin(conf)
        request = [ConsumerGroupTopicPartitions(name)]
        try:
            admin.list_consumer_group_offsets(request, request_timeout=10)[name].result(timeout=15)
        except KafkaException as exc:
            refuse(exc, operation="Describe", resource=f"group '{name}'")

    def init_transactions() -> None:
        producer = KAFKA.producer({**conf, "transactional.id": name})
        try:
            producer.init_transactions(15)
        except KafkaException as exc:
            refuse(exc, operation="Write", resource=f"transactional id '{name}'")

    table: dict[tuple[str, str], Callable[[], None]] = {
        ("topic", "Read"): read,
        ("topic", "Write"): write,
        ("topic", "Describe"): describe_topic,
        ("topic", "Create"): create,
        ("group", "Read"): join_group,
        ("group", "Describe"): describe_group,
        ("transactional-id", "Write"): init_transactions,
    }
    if acl.name == reader_group_prefix(names) and readable is not None:
        return lambda: read(readable)
    return table[(acl.resource, acl.operation)]


def _one_record_in_every_topic(info: BrokerInfo, names: TopicNames) -> None:
    """A read of an empty topic needs only Describe (no fetch is made): give every topic a record."""
    producer = KAFKA.producer(info.client_conf())
    failed: list[object] = []
    for spec in topic_specs(names, ingest_partitions=2, consumers=[c.consumer for c in CARDS]):
        for partition in range(spec.partitions):
            producer.produce(  # keyed: a compacted topic refuses a record without a key
                spec.name, b"not a record", b"probe", partition=partition,
                on_delivery=lambda err, _msg: failed.append(err) if err is not None else None,
            )  # fmt: skip
    assert producer.flush(30) == 0 and not failed, failed


def test_every_acl_the_command_prints_is_needed_by_its_role(secured: BrokerInfo) -> None:
    names = new_pipeline(secured, "n")
    _one_record_in_every_topic(secured, names)
    conf = secured.client_conf("carol", TLS)
    checked = 0
    for role in ROLES:
        acls = role_acls(role, names, consumers=[CARD])
        member_of = names.consumer_group(CARD) if role == "consumer" else None
        readable = next(
            (a.name for a in acls if (a.resource, a.operation, a.pattern) == ("topic", "Read", "literal")),
            None,
        )
        grant(secured, "carol", acls)
        try:
            for acl in acls:
                operation = operation_needing(acl, names, conf, readable, member_of)
                try:
                    operation()  # the whole list: allowed
                except Refused as exc:
                    pytest.fail(f"role {role}: {acl}: refused with the whole list: {exc}")
                revoke(secured, "carol", [acl])
                try:
                    operation()
                except Refused as exc:
                    line = str(exc)
                else:
                    pytest.fail(f"role {role}: {acl} taken away, and the operation that needs it was allowed")
                finally:
                    grant(secured, "carol", [acl])
                assert "\n" not in line and "User:carol" in line, line
                assert f"{acl.operation} on " in line, (role, acl, line)
                named = acl.name.rstrip(".-") if acl.pattern == "prefixed" else acl.name
                kind = acl.resource.replace("-", " ")
                assert f"{kind} '{named}" in line or f"{kind} '{acl.name}" in line, (role, acl, line)
                checked += 1
        finally:
            revoke(secured, "carol", acls)
    assert checked == sum(len(v) for v in acls_for(ROLES, names, consumers=[CARD]).values())


@pytest.mark.parametrize(("me", "other"), [("alice", "bob"), ("bob", "alice")])
def test_two_pipelines_under_two_principals_are_refused_each_others_resources(
    secured: BrokerInfo, me: str, other: str
) -> None:
    mine, theirs = new_pipeline(secured, "m"), new_pipeline(secured, "o")
    everything = {r: a for r, a in acls_for(ROLES, mine).items()}
    grant(secured, me, [a for acls in everything.values() for a in acls])
    grant(secured, other, [a for acls in acls_for(ROLES, theirs).values() for a in acls])
    conf = secured.client_conf(me, TLS)
    kinds = [
        Acl("topic", "{p}.ingest", "literal", "Read"),
        Acl("topic", "{p}.results", "literal", "Write"),
        Acl("topic", "{p}.", "prefixed", "Create"),
        Acl("group", "{p}-processor", "literal", "Read"),
        Acl("group", "{p}-consumer-", "prefixed", "Describe"),
        Acl("transactional-id", "{p}-processor-", "prefixed", "Write"),
        Acl("transactional-id", "{p}-consumer-" + CARD, "literal", "Write"),
    ]
    try:
        for pattern in kinds:
            own = Acl(
                pattern.resource, pattern.name.format(p=mine.prefix), pattern.pattern, pattern.operation
            )
            operation_needing(own, mine, conf)()  # its own: allowed
            foreign = Acl(
                pattern.resource, pattern.name.format(p=theirs.prefix), pattern.pattern, pattern.operation
            )
            with pytest.raises(Refused) as refused:
                operation_needing(foreign, theirs, conf)()
            line = str(refused.value)
            assert theirs.prefix in line and f"User:{me}" in line, (pattern, line)
    finally:
        revoke(secured, me, [a for acls in everything.values() for a in acls])
        revoke(secured, other, [a for acls in acls_for(ROLES, theirs).values() for a in acls])
