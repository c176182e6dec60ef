"""Restore (processor/state/restore.py) against the session broker: a changelog and ingest messages are
written as a processor's commits leave them, and restore must give back exactly the waiting items
(each with its home) and the in-flight batches (with their items' heads) of the partitions asked for.

The changelog records are written with the changelog module's own encoders (processor/state/changelog.py),
the way the committer writes them, so nothing here depends on the committer; tests/broker/test_commit.py
checks the committer writes these records.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from processor.core.contract import Contract
from processor.kafka.topics import TopicNames
from processor.state import changelog
from processor.state.restore import latest_checkpoint, latest_contracts, restore, transactional_id
from processor.wire.control import encode_contract, encode_ledger_snapshot
from processor.wire.errors import DecodeError
from processor.wire.heads import ItemHead
from processor.wire.items import encode_token_item
from processor.wire.records import ContractRecord, LedgerSnapshotRecord, new_token_item
from tests.broker.rig import new_topics

pytestmark = pytest.mark.kafka

CARD = Contract("card", "m", budget_tokens=4096, max_items=8, pad_multiple=8, max_inflight=2)
B1 = changelog.BatchEntry("b1", "card", 0, 8, 8, 1_000, False, ((0, 0), (1, 0)), 1, (1,), ((2, 7),))


@dataclass
class Topics:
    """A fresh prefix, what its ingest partitions hold, and a producer for the rest."""

    conf: dict[str, str]
    names: TopicNames
    group: str
    producer: Producer
    messages: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (partition, offset) -> value

    def ingest(self, partition: int, ids: list[str]) -> None:
        """Items ``ids`` at the next offsets of ``partition`` (a fresh topic: offsets from 0)."""
        offset = sum(1 for p, _o in self.messages if p == partition)
        for i, item_id in enumerate(ids):
            rec = new_token_item(item_id, "m", [7] * (len(item_id) + 1), 0, shape_components=["sys"])
            value = encode_token_item(rec)
            self.produce(self.names.ingest, value, item_id.encode(), partition)
            self.messages[(partition, offset + i)] = value
        assert self.producer.flush(30) == 0

    def produce(self, topic: str, value: bytes | None, key: bytes, partition: int = 0) -> None:
        self.producer.produce(topic, value, key, partition=partition)

    def waiting(self, *refs: changelog.WaitingRef) -> None:
        sets = changelog.WaitingSets()
        sets.add_all(refs)
        for home, key, value in sets.flush():
            self.produce(self.names.changelog, value, key, home)

    def commit_offsets(self, offsets: dict[int, int]) -> None:
        consumer = Consumer({**self.conf, "group.id": self.group, "enable.auto.commit": "false"})
        try:
            consumer.commit(
                offsets=[TopicPartition(self.names.ingest, p, o) for p, o in offsets.items()],
                asynchronous=False,
            )
        finally:
            consumer.close()


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[Topics]:
    conf, names = new_topics(kafka_bootstrap, "r", [CARD.consumer], ingest_partitions=2)
    t = Topics(conf, names, f"{names.prefix}-proc", Producer({**conf, "enable.idempotence": "true"}))
    yield t
    t.producer.flush(30)


@pytest.fixture
def committed(topics: Topics) -> Topics:
    """Partitions 0 and 1 after a commit: four waiting items (one of partition 0 homed in partition 1,
    put back there by a batch), a half-answered batch in partition 1, a finished batch tombstoned and
    an aborted transaction's batch in partition 0, a retired contract, and two instances' checkpoints."""
    t = topics
    t.ingest(0, ["a0", "a1", "a2", "a3", "a4"])
    t.ingest(1, ["b0", "b1", "b2", "b3"])
    cl = t.names.changelog
    t.waiting(changelog.WaitingRef(0, 0, 1), changelog.WaitingRef(0, 0, 3), changelog.WaitingRef(1, 1, 2))
    t.waiting(changelog.WaitingRef(1, 0, 4))
    t.produce(cl, B1.value(), changelog.batch_key("b1"), 1)
    gone = changelog.BatchEntry("gone", "card", 0, 8, 8, 1_000, False, ((0, 2),), 0)
    t.produce(cl, gone.value(), changelog.batch_key("gone"), 0)
    t.produce(cl, None, changelog.batch_key("gone"), 0)  # it finished: tombstoned
    t.produce(cl, None, changelog.batch_key("b1"), 0)  # a tombstone in another partition ends nothing
    t.produce(t.names.contracts, encode_contract(ContractRecord(CARD, 1)), b"card")
    old = Contract("old", "m", budget_tokens=64, max_items=1)
    t.produce(t.names.contracts, encode_contract(ContractRecord(old, 1)), b"old")
    t.produce(t.names.contracts, None, b"old")  # retired
    for instance, sequence in (("p0", 1), ("p1", 1), ("p0", 2)):
        snapshot = LedgerSnapshotRecord(
            instance=instance,
            taken_ms=sequence,
            sequence=sequence,
            counters={"queued_items": sequence},
            per_model={},
            per_consumer={},
        )
        t.produce(t.names.accounting, encode_ledger_snapshot(snapshot), instance.encode())
    assert t.producer.flush(30) == 0
    aborted = Producer({**t.conf, "transactional.id": f"{t.group}-zombie"})
    aborted.init_transactions(30)
    aborted.begin_transaction()
    phantom = changelog.BatchEntry("phantom", "card", 0, 8, 8, 1_000, False, ((0, 1),), 1)
    aborted.produce(cl, phantom.value(), changelog.batch_key("phantom"), partition=0)
    aborted.produce(cl, changelog.PRESENT, changelog.waiting_key(1, 3), partition=1)
    assert aborted.flush(30) == 0
    aborted.abort_transaction(30)
    t.commit_offsets({0: 5, 1: 4})
    return t


@dataclass
class Calls:
    """What restore handed its callbacks, in order."""

    order: list[str] = field(default_factory=list)
    contracts: dict[str, Contract] = field(default_factory=dict)
    waiting: dict[tuple[int, int], tuple[int, ItemHead]] = field(default_factory=dict)

    def on_contracts(self, found: dict[str, Contract]) -> None:
        self.order.append("contracts")
        self.contracts = dict(found)

    def on_waiting(self, ref: tuple[int, int], home: int, head: ItemHead, timestamp_ms: int) -> None:
        self.order.append("waiting")
        assert ref not in self.waiting, f"{ref} handed over twice"
        assert timestamp_ms > 1_700_000_000_000, timestamp_ms  # the message's own (epoch ms)
        self.waiting[ref] = (home, head)


def run(t: Topics, partitions: list[int] | None) -> tuple[Calls, object]:
    calls = Calls()
    state = restore(t.conf, t.names, t.group, partitions, calls.on_contracts, calls.on_waiting)
    return calls, state


def test_restore_gives_back_exactly_the_waiting_items_and_batches_that_were_committed(
    committed: Topics,
) -> None:
    t = committed
    calls, state = run(t, None)
    assert calls.order[0] == "contracts" and calls.contracts == {"card": CARD}  # before any item
    assert {ref: (home, head.item_id) for ref, (home, head) in calls.waiting.items()} == {
        (0, 1): (0, "a1"),
        (0, 3): (0, "a3"),
        (1, 2): (1, "b2"),
        (0, 4): (1, "a4"),  # from ingest partition 0, recorded in partition 1 where its batch was
    }
    for ref, (_home, head) in calls.waiting.items():
        assert head.message == t.messages[ref] and head.token_count == len(head.item_id) + 1
    assert state.changelog.batches == {"b1": B1} and state.changelog.homes == {"b1": 1}
    assert {ref: head.item_id for ref, head in state.records.items()} == {(0, 0): "a0", (1, 0): "b0"}
    assert state.records[(0, 0)].message == t.messages[(0, 0)]
    assert state.committed == {0: 5, 1: 4}
    assert state.contracts == {"card": CARD}
    assert state.partitions == [] and state.seconds > 0


def test_restore_of_some_partitions_reads_only_their_changelog(committed: Topics) -> None:
    calls, state = run(committed, [1])
    assert {ref: home for ref, (home, _h) in calls.waiting.items()} == {(1, 2): 1, (0, 4): 1}
    assert set(state.changelog.batches) == {"b1"} and state.partitions == [1]
    calls, state = run(committed, [0])
    assert {ref: home for ref, (home, _h) in calls.waiting.items()} == {(0, 1): 0, (0, 3): 0}
    assert state.changelog.batches == {} and state.records == {}  # finished, and aborted: neither is back
    calls, state = run(committed, [])
    assert calls.waiting == {} and state.changelog.records == 0 and calls.contracts == {"card": CARD}


def test_the_checkpoint_and_contracts_are_the_latest_committed(committed: Topics) -> None:
    t = committed
    p0 = latest_checkpoint(t.conf, t.names, "p0")
    assert p0 is not None and (p0.instance, p0.sequence, p0.counters) == ("p0", 2, {"queued_items": 2})
    assert latest_checkpoint(t.conf, t.names, "p9") is None
    assert latest_contracts(t.conf, t.names) == {"card": CARD}
    assert transactional_id("p0", t.group) == f"{t.group}-p0"


def test_a_changelog_entry_whose_ingest_message_is_gone_fails_the_restore(topics: Topics) -> None:
    t = topics
    t.ingest(0, ["a0", "a1"])
    t.waiting(changelog.WaitingRef(0, 0, 1), changelog.WaitingRef(0, 0, 7))  # 7 was never there
    assert t.producer.flush(30) == 0
    t.commit_offsets({0: 2})
    with pytest.raises(
        RuntimeError,
        match=r"1 changelog entries refer to ingest messages that are gone \(first: partition 0 offset 7\)",
    ):
        run(t, [0])


def test_a_restored_message_that_is_not_an_item_is_refused(topics: Topics) -> None:
    """A topic recreated under the same name: the offset the changelog names holds something else."""
    t = topics
    t.produce(t.names.ingest, b"not an item", b"k", 0)
    t.waiting(changelog.WaitingRef(0, 0, 0))
    assert t.producer.flush(30) == 0
    t.commit_offsets({0: 1})
    with pytest.raises(DecodeError):
        run(t, [0])
