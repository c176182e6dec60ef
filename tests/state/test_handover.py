"""Handing lane state between processor instances, without Kafka.

The scheduler's release and adopt, with the ledger balancing throughout; then PartitionHandover
(processor/state/handover.py) itself, with a context whose restore is a prepared changelog:
what an assignment adopts, what a revocation lets go of, and the restart check."""

from __future__ import annotations

import dataclasses
import gc
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.core.accounting import LedgerImbalance
from processor.core.contract import Contract
from processor.core.item import Batch
from processor.core.scheduler import Scheduler
from processor.kafka.exits import EXIT_TEMPFAIL, FencedByGroup, exit_code
from processor.kafka.outage import is_outage
from processor.kafka.topics import TopicNames
from processor.state import changelog, modes
from processor.state.changelog_writer import ChangelogWriter
from processor.state.credits import CreditBook
from processor.state.durability import CommitClients
from processor.state.handover import (
    OFFSETS_WAIT_KEPT_S,
    OFFSETS_WAIT_S,
    RESTORE_RETRY_S,
    HandoverContext,
    PartitionHandover,
    Restored,
)
from processor.state.ingest import IngestItem
from processor.state.lane_log import OffsetLog
from processor.state.restore import RestoredState
from processor.state.results import ResultsCursor
from processor.wire.heads import ItemHead, decode_item_head
from processor.wire.items import encode_token_item
from processor.wire.records import LedgerSnapshotRecord, new_token_item
from tests.core.helpers import MODEL, make_contract, make_items, make_scheduler, submit_all

# -- release and adopt in the core -------------------------------------------------------------


def _emit_one(sched: Scheduler) -> Batch:
    batches = sched.dispatch(0)
    assert batches
    return batches[0]


def test_release_then_adopt_restores_the_same_work_and_balances() -> None:
    sched = make_scheduler(make_contract(inflight=1, items=2, budget=4096))
    items = submit_all(sched, make_items([100, 104, 108, 112]))
    batch = _emit_one(sched)
    first = batch.items[0]
    assert sched.item_done(batch.batch_id, first.id, True, 1) is False  # half answered
    done = sched.done_items(batch.batch_id)
    assert done == [first.id]
    waiting = [it for it in items if not it.dispatched]
    before = sched.view.handover_delta()

    sched.release_all()
    sched.check(deep=True)
    assert sched.view.waiting().items == 0 and not list(sched.in_flight_batches())

    for it in waiting:
        sched.adopt_waiting(it, 2)
    assert sched.adopt_in_flight(batch, 2, set(done))
    sched.check(deep=True)
    assert sched.view.handover_delta() == before  # adopted exactly what was released
    # the answered item stays answered: its replayed completion is not counted twice
    assert sched.item_done(batch.batch_id, first.id, True, 3) is None
    assert sched.item_done(batch.batch_id, batch.items[1].id, True, 3) is True
    completed = sched.view.total("completed")
    assert completed.items == 2
    sched.check(deep=True)


def test_a_scheduler_limited_to_its_share_of_slots_sends_no_more() -> None:
    sched = make_scheduler()
    sched.set_contract(make_contract(inflight=4, items=1), slots=1)
    submit_all(sched, make_items([100] * 5))
    assert len(sched.dispatch(0)) == 1
    sched.set_contract(make_contract(inflight=4, items=1), slots=0)
    assert sched.dispatch(0) == []


def test_adopting_a_batch_of_a_retired_consumer_puts_its_outstanding_items_back() -> None:
    sched = make_scheduler(make_contract("gone", inflight=1, items=2))
    submit_all(sched, make_items([100, 100]))
    batch = _emit_one(sched)
    sched.item_done(batch.batch_id, batch.items[0].id, True, 1)
    done = set(sched.done_items(batch.batch_id))

    other = Scheduler()
    other.set_contract(make_contract("alive", model=MODEL))
    assert not other.adopt_in_flight(batch, 2, done)
    assert other.view.waiting().items == 1  # only the unanswered item waits again
    other.check(deep=True)


# -- PartitionHandover: the service's rebalance callbacks ------------------------------------------

PARTITIONS = 4
CARD = Contract("c", "m", budget_tokens=4096, max_items=8, pad_multiple=8, max_inflight=4)
SHAPE = ["system: be brief"]


def head(item_id: str, length: int) -> ItemHead:
    """An ingest message's head, decoded from the bytes a producer would write."""
    return decode_item_head(
        encode_token_item(new_token_item(item_id, "m", range(1, length + 1), 0, shape_components=SHAPE))
    )


class Service:
    """The handover with a context around a real scheduler, credit book, results cursor and
    delivery mode; commits and results-reader assignments are counted, not made."""

    def __init__(self, mode: str = "transactional") -> None:
        self.topics = TopicNames("handover")
        self.restored: list[Restored] = []
        self.core = Scheduler()
        self.credits = CreditBook(PARTITIONS)
        self.results = ResultsCursor()
        self.commits: list[bool] = []
        self.control_assignments = 0
        self.restores: list[list[int]] = []
        self.records: list[tuple[int, bytes, bytes | None]] = []
        none: Any = None  # no clients: nothing here commits
        clients = CommitClients(none, none, none)
        if mode == "transactional":
            options = modes.ExactlyOnceOptions(self.core.is_in_flight, self.core.done_items, eager_ms=50)
            self.mode = modes.exactly_once(clients, self.topics, "p0", 500, options)
        else:
            self.mode = modes.at_least_once(clients, self.topics, "p0", 500)
        self.handover = PartitionHandover(
            HandoverContext(
                core=self.core,
                ownership=self.mode.ownership,
                credits=self.credits,
                results=self.results,
                restore=lambda partitions, on_contracts, on_waiting, wait_s: RESTORE(
                    partitions, on_contracts, on_waiting, wait_s
                ),
                commit=self._commit,
                set_contract=self._set_contract,
                reassign_results=self._assign_control,
                now_ms=lambda: 1_000,
                clock=lambda: 123.0,
                on_restored=self.restored.append,
                ingest_topic=self.topics.ingest,
                incremental=True,
            )
        )

    @property
    def owned(self) -> frozenset[int]:
        return self.handover.owned

    def _commit(self) -> None:
        """As the forced commit does: the lane log's records go out (kept here, in order)."""
        self.commits.append(True)
        lanes = self.mode.lane_log
        if isinstance(lanes, ChangelogWriter):
            self.records += lanes.changes()

    def _assign_control(self) -> None:
        self.control_assignments += 1

    def _set_contract(self, contract: Contract) -> None:
        self.core.set_contract(contract, self.credits.share(contract.max_inflight))


@dataclass
class Changelog:
    """What the changelog and ingest topics hold for some partitions, and what restore was asked."""

    waiting: dict[tuple[int, int], tuple[int, ItemHead]] = field(default_factory=dict)  # ref -> home, head
    batches: list[tuple[int, changelog.BatchEntry]] = field(default_factory=list)  # (partition, entry)
    heads: dict[tuple[int, int], ItemHead] = field(default_factory=dict)  # items of the batches
    contracts: dict[str, Contract] = field(default_factory=lambda: {CARD.consumer: CARD})
    stamps: dict[tuple[int, int], int] = field(default_factory=dict)  # ref -> message timestamp (0: none)
    asked: list[tuple[str, list[int] | None]] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)  # each restore's wait for committed offsets
    written: list[tuple[int, bytes, bytes | None]] = field(default_factory=list)  # later, in log order

    def restore(self, partitions, on_contracts, on_waiting, wait_s=30.0) -> RestoredState:  # type: ignore[no-untyped-def]
        """Stands in for processor.state.restore.restore: the records go through a real fold."""
        self.asked.append(("handover-proc", partitions))
        self.waits.append(wait_s)
        state = changelog.ChangelogState()
        sets = changelog.WaitingSets()
        mine = set(partitions)  # a changelog partition is read only when its ingest partition is asked
        refs = [(ref, home) for ref, (home, _h) in self.waiting.items() if home in mine]
        sets.add_all(changelog.WaitingRef(home, *ref) for ref, home in refs)
        for home, key, value in sets.flush():
            state.apply(key, value, home)
        for partition, entry in self.batches:
            if partition in mine:
                state.apply(changelog.batch_key(entry.batch_id), entry.value(), partition)
        for partition, key, value in self.written:
            if partition in mine:
                state.apply(key, value, partition)
        heads = {**self.heads, **{ref: h for ref, (_home, h) in self.waiting.items()}}
        on_contracts(self.contracts)
        for ref, home in state.waiting.items():
            on_waiting(ref, home, heads[ref], self.stamps.get(ref, 0))
        return RestoredState(sorted(partitions), state, heads, self.contracts, seconds=0.5)


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[Changelog]:
    """Partitions 0 and 1 as their last commit left them: three waiting items, a batch of ``c`` half
    answered in slot 1, and a batch of a consumer that has since retired."""
    log = Changelog()
    log.waiting = {(0, 10): (0, head("w1", 100)), (0, 11): (0, head("w2", 50)), (1, 5): (1, head("w3", 20))}
    log.heads = {(0, 3): head("b1-a", 30), (1, 4): head("b1-b", 40), (1, 6): head("gone-a", 60)}
    log.batches = [
        (
            1,
            changelog.BatchEntry(
                "b1", "c", 0, 40, 8, 900, False, ((0, 3), (1, 4)), 1, (0,), ((0, 17), (2, 30))
            ),
        ),
        (0, changelog.BatchEntry("b2", "retired", 0, 64, 8, 900, False, ((1, 6),), 0, (), ((1, 2),))),
    ]
    monkeypatch.setattr(sys.modules[__name__], "RESTORE", log.restore)
    yield log
    gc.unfreeze()  # _take_over freezes what it restored; give this test process its collector back


class Member:
    """The ingest consumer as the callbacks see it: what they assign, pause and resume."""

    def __init__(self) -> None:
        self.assigned: list[int] = []
        self.paused: set[int] = set()

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.assigned += [tp.partition for tp in tps]

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}


MEMBER = Member()


def assign(svc: Service, partitions: list[int], member: Member = MEMBER) -> None:
    """The group's callback, then the loop's next step."""
    svc.handover.on_assign(member, [TopicPartition("handover.ingest", p) for p in partitions])
    svc.handover.restore_pending(member)


def revoke(svc: Service, partitions: list[int], member: Member = MEMBER) -> None:
    svc.handover.on_revoke(member, [TopicPartition("handover.ingest", p) for p in partitions])


def RESTORE(partitions, on_contracts, on_waiting) -> RestoredState:  # type: ignore[no-untyped-def]
    raise AssertionError("the restored fixture replaces this")


def test_an_assignment_adopts_exactly_what_the_changelog_of_its_partitions_holds(restored: Changelog) -> None:
    svc = Service()
    svc.results.next.update({0: 50, 1: 1, 2: 20})
    assign(svc, [1, 0])
    assert restored.asked == [("handover-proc", [0, 1])]  # only the assigned partitions, sorted
    assert svc.owned == frozenset({0, 1}) and svc.credits.owned_partitions == frozenset({0, 1})
    core = svc.core
    # the three waiting items, and the retired consumer's item put back in a lane: four wait
    assert core.view.waiting().items == 4
    assert core.view.waiting().tokens == 100 + 50 + 20 + 60
    assert core.is_in_flight("b1") and not core.is_in_flight("b2")
    assert core.done_items("b1") == ["b1-a"]  # the answered item stays answered
    assert core.item_done("b1", "b1-a", True, 2_000) is None  # its replayed completion counts nothing
    assert core.item_done("b1", "b1-b", True, 2_000) is True  # the outstanding one finishes the batch
    core.check(deep=True)
    # b1 holds slot 1 of c again; of c's four slots partitions 0 and 1 own two, so one is left
    assert svc.credits.held("c") == 1
    assert svc.credits.take("c", CARD.max_inflight, "next") == (0, 0)
    with pytest.raises(RuntimeError, match="no free in-flight slot"):
        svc.credits.take("c", CARD.max_inflight, "one-too-many")
    assert core.view.consumer("c").slots == 2  # the contract was set with this instance's share
    # completions are read again from where b1's could first appear, only where that is earlier
    assert svc.results.next == {0: 17, 1: 1, 2: 20} and svc.control_assignments == 1
    assert svc.restored == [Restored([0, 1], 3, 2, 0.5)]
    assert svc.handover.restoring_since_s is None and svc.handover.finished_s == 123.0


def test_adopted_waiting_items_are_logged_where_their_records_live(restored: Changelog) -> None:
    svc = Service()
    assign(svc, [0, 1])
    waiting = {it.id: it for it in svc.core.view.waiting_list()}
    assert {i: (it.home, it.logged) for i, it in waiting.items() if i.startswith("w")} == {
        "w1": (0, True),
        "w2": (0, True),
        "w3": (1, True),
    }
    # the retired consumer's item is back in a lane, homed in its batch's partition, to be logged anew
    assert (waiting["gone-a"].home, waiting["gone-a"].logged) == (0, False)
    lanes = svc.mode.lane_log
    assert isinstance(lanes, ChangelogWriter)
    assert [it.id for it in lanes._new_items] == ["gone-a"] and lanes._finished == ["b2"]


def test_restored_items_keep_their_first_arrival_and_are_adopted_oldest_first(restored: Changelog) -> None:
    """Waiting ages go on across a restart: an item's arrival is its ingest message's timestamp (the
    core's clock is epoch ms; now is 1,000 here), unless that is missing or ahead of now."""
    restored.stamps = {(0, 10): 700, (1, 5): 300, (0, 11): 5_000}  # w2's producer clock runs fast
    svc = Service()
    assign(svc, [0, 1])
    arrival = {it.id: it.arrival_ms for it in svc.core.view.waiting_list()}
    assert (arrival["w1"], arrival["w3"], arrival["w2"]) == (700, 300, 1_000)
    assert svc.core.oldest_waiting_ms(MODEL, 10) == 300  # the arrival queue starts with the oldest


def test_a_revocation_commits_then_lets_go_of_everything(restored: Changelog) -> None:
    svc = Service()
    assign(svc, [0, 1])
    before = svc.core.view.handover_delta()
    revoke(svc, [0, 1])
    assert svc.commits == [True]  # forced, while the partitions are still ours
    core = svc.core
    assert core.view.waiting().items == 0 and not list(core.in_flight_batches())
    assert svc.owned == frozenset() and svc.credits.held("c") == 0 and svc.credits.share(4) == 0
    assert core.view.consumer("c").slots == 0 and core.dispatch(5_000) == []  # nothing more may be sent
    core.check(deep=True)
    # what this instance adopted it released again, to the item and token: the next owner adopts it
    after = core.view.handover_delta()
    assert before["m"] == (5, 100 + 50 + 20 + 40 + 60) and after["m"] == (0, 0)
    assert restored.asked == [("handover-proc", [0, 1])]


def test_a_revocation_while_closing_does_nothing(restored: Changelog) -> None:
    svc = Service()
    assign(svc, [0, 1])
    svc.handover.closing = True
    revoke(svc, [0, 1])
    assert svc.commits == [] and svc.core.view.waiting().items == 4 and svc.owned == frozenset({0, 1})


def test_a_member_the_group_fenced_commits_nothing_more_and_its_loop_ends_the_run(
    restored: Changelog,
) -> None:
    """Issue 36's doubled items: after a loss the assignment is empty, so a commit would carry no
    offsets for the broker to refuse, yet hold batches of partitions another member now serves."""
    svc = Service()
    assign(svc, [0, 1])
    svc.handover.raise_if_lost("processor p")  # owning partitions is no reason to stop
    svc.handover.on_lost(MEMBER, [TopicPartition("handover.ingest", p) for p in (0, 1)])
    assert svc.commits == []  # the partitions may be another's already
    with pytest.raises(FencedByGroup, match="processor p: fenced by its group"):
        svc.handover.raise_if_lost("processor p")
    assert exit_code(FencedByGroup("x")) == EXIT_TEMPFAIL and is_outage(FencedByGroup("x"))


def test_at_least_once_keeps_its_lanes_and_forgets_only_the_revoked_offsets() -> None:
    svc = Service("at-least-once")
    lanes = svc.mode.lane_log
    assert isinstance(lanes, OffsetLog)
    for partition, offset in ((0, 7), (1, 3)):
        item = IngestItem.from_head(head(f"i{partition}", 10), 0, partition, offset)
        lanes.item_seen(item)
        svc.core.submit(item, 0)
    assign(svc, [0, 1])  # at-least-once restores nothing
    assert svc.owned == frozenset() and svc.core.view.waiting().items == 2
    revoke(svc, [1])
    assert svc.commits == [True]
    assert lanes.offsets.committable() == {0: 7}  # partition 1's offsets are the next owner's
    assert svc.core.view.waiting().items == 2  # the items stay: they are re-read and deduplicated


def test_a_restart_that_keeps_every_partition_must_restore_what_the_checkpoint_counted(
    restored: Changelog,
) -> None:
    def restart(held: list[tuple[str, int]]) -> Service:
        """A restarted service that resumes, as start() does, a checkpoint of a process that held
        ``held`` waiting items over every partition."""
        before = Service()
        for item_id, length in held:
            before.core.submit(IngestItem.from_head(head(item_id, length), 0, 0, 0), 0)
        counters = {**before.core.view.ledger_snapshot(), "owned_partitions": PARTITIONS}
        svc = Service()
        svc.handover.resume(
            LedgerSnapshotRecord(
                instance="p0", taken_ms=0, sequence=1, counters=counters, per_model={}, per_consumer={}
            )
        )
        return svc

    restored.batches = []
    restored.waiting[(2, 1)] = (2, head("w4", 8))
    counted = [("w1", 100), ("w2", 50), ("w3", 20), ("w4", 8)]
    svc = restart(counted)
    assign(svc, list(range(PARTITIONS)))  # the changelog holds exactly what was counted: fine
    assert svc.handover._counted_at_start is None and svc.core.view.waiting().items == 4

    phantom = restart([*counted, ("w5", 30)])  # the checkpoint claims an item the changelog lacks
    with pytest.raises(
        LedgerImbalance, match=r"restore: model m: the checkpoint counted -1 items / -30 tokens"
    ):
        assign(phantom, list(range(PARTITIONS)))

    partial = restart([*counted, ("w5", 30)])
    assign(partial, [0, 1, 2])  # not every partition came back: state may rightly be elsewhere
    assert partial.core.view.waiting().items == 4


# -- incremental rebalances (the consumer protocol) and the restore outside the callback ----------


def test_an_assignment_is_paused_until_the_loop_restores_it(restored: Changelog) -> None:
    svc, member = Service(), Member()
    svc.handover.on_assign(member, [TopicPartition("handover.ingest", p) for p in (0, 1)])
    # the callback only records: nothing read, nothing adopted, the partitions paused
    assert restored.asked == [] and member.assigned == [0, 1] and member.paused == {0, 1}
    assert svc.handover.pending == {0, 1} and svc.owned == frozenset()
    assert svc.handover.restoring_since_s == 123.0
    assert svc.handover.restore_pending(member) is True
    assert restored.asked == [("handover-proc", [0, 1])] and member.paused == set()
    assert svc.owned == {0, 1} and svc.handover.pending == frozenset()
    assert svc.handover.restore_pending(member) is False  # nothing left to restore


def test_more_partitions_are_restored_beside_what_is_held(restored: Changelog) -> None:
    """An incremental assignment adds: the batches and slots already held stay held."""
    svc = Service()
    assign(svc, [1])
    assert svc.core.is_in_flight("b1") and svc.credits.held("c") == 1
    assert svc.core.view.waiting().items == 1  # w3
    assign(svc, [0])
    assert restored.asked == [("handover-proc", [1]), ("handover-proc", [0])]
    assert svc.owned == {0, 1} and svc.commits == [] and svc.core.is_in_flight("b1")
    assert svc.credits.held("c") == 1 and svc.core.view.consumer("c").slots == 2
    assert svc.core.view.waiting().items == 4  # w1, w2, w3 and the retired consumer's item
    svc.core.check(deep=True)


def test_a_partial_revocation_keeps_the_partitions_kept_in_memory_and_lets_go_of_the_rest(
    restored: Changelog,
) -> None:
    restored.waiting[(1, 8)] = (1, head("w6", 100))  # as long as w1: they leave in one batch
    svc, member = Service(), Member()
    assign(svc, [0, 1], member)
    core = svc.core
    (out,) = core.dispatch(1_500)  # in c's one free slot, 0: its record goes to partition 0
    lanes = svc.mode.lane_log
    lanes.batch_emitted(out, svc.mode.placement.place(out, svc.credits, CARD.max_inflight, svc.results))
    assert [it.id for it in out.items] == ["w1", "w6"]
    before = core.view.handover_delta()["m"]
    revoke(svc, [1], member)
    # committed while ours; partition 0 is neither restored again nor paused: it dispatches on
    assert svc.commits == [True] and restored.asked == [("handover-proc", [0, 1])]
    assert svc.owned == {0} and svc.handover.pending == frozenset() and member.paused == set()
    # w3 is homed in partition 1 and b1's record lives there: both are its next owner's
    assert {it.id for it in core.view.waiting_list()} == {"w2", "gone-a"}
    assert not core.is_in_flight("b1") and core.handed_over("b1")
    assert core.item_done("b1", "b1-b", True, 2_000) is None  # its completion is booked there, not here
    # the batch kept has an item of partition 1: homed now where the batch's record lives, so that
    # put back in the lanes it is logged in a partition this instance owns (as a restore homes it)
    assert core.is_in_flight(out.batch_id)
    assert [cast(IngestItem, it).home for it in out.items] == [0, 0]
    # released exactly w3 (20 tokens) and b1's outstanding item (40): the next owner adopts them
    assert core.view.handover_delta()["m"] == (before[0] - 2, before[1] - 20 - 40)
    core.check(deep=True)
    # of c's four slots partition 0 owns one, which the batch kept holds; b1's went with partition 1
    assert svc.credits.held("c") == 1 and svc.credits.share(CARD.max_inflight) == 1
    assert core.view.consumer("c").slots == 1 and core.dispatch(2_500) == []
    assert isinstance(lanes, ChangelogWriter) and set(lanes._logged_batches) == {out.batch_id}
    written = len(svc.records)
    lanes.requeued(out.batch_id, core.retire("c", 2_600)[0].items)  # put back: its items wait again
    svc.handover.ctx.commit()
    assert {p for p, _key, _value in svc.records[written:]} == {0}  # logged where this instance owns
    revoke(svc, [0], member)  # the last partition: everything goes at once
    assert svc.owned == frozenset() and core.view.waiting().items == 0
    assert core.view.handover_delta()["m"] == (0, 0) and not lanes._logged_batches
    core.check(deep=True)


def _held(svc: Service) -> tuple[dict[str, int], dict[str, tuple[str, list[str], list[str]]]]:
    """What a service holds: waiting items by id with their home, in-flight batches by id."""
    core = svc.core
    waiting = {it.id: it.home for it in core.view.waiting_list() if isinstance(it, IngestItem)}
    flights = {
        b.batch_id: (b.consumer, [it.id for it in b.items], core.done_items(b.batch_id))
        for b in core.in_flight_batches()
    }
    return waiting, flights


def test_after_a_partial_revocation_a_restore_of_the_partitions_kept_rebuilds_what_is_in_memory(
    restored: Changelog,
) -> None:
    """The kept partitions' changelog stays right: what a later commit writes restores exactly the
    lane state the instance kept in memory (nothing lost, nothing doubled at the next handover)."""
    svc, member = Service(), Member()
    restored.waiting[(1, 9)] = (0, head("w5", 70))  # an item of partition 1 homed in 0 (put back there)
    assign(svc, [0, 1], member)
    revoke(svc, [1], member)
    batches = svc.core.dispatch(3_000)  # the kept partition dispatches on, in slot 0 of partition 0
    assert batches
    for batch in batches:
        lanes = svc.mode.lane_log
        lanes.batch_emitted(batch, svc.mode.placement.place(batch, svc.credits, 4, svc.results))
    first = batches[0]
    if len(first.items) > 1:
        svc.core.item_done(first.batch_id, first.items[0].id, True, 3_001)
        svc.mode.in_flight.batch_progress(first.batch_id)
    svc.handover.ctx.commit()
    restored.written = list(svc.records)

    fresh = Service()
    assign(fresh, [0], Member())
    assert _held(fresh) == _held(svc)
    assert "w5" in {it.id for it in svc.core.view.waiting_list()} | {
        it.id for b in svc.core.in_flight_batches() for it in b.items
    }
    for stage in ("queued", "in_flight"):
        assert fresh.core.view.total(stage) == svc.core.view.total(stage)
    fresh.core.check(deep=True)


def test_the_lane_log_lets_go_of_partitions_only_just_after_a_commit(restored: Changelog) -> None:
    svc = Service()
    assign(svc, [0, 1])  # the retired consumer's item waits to be logged: a change not yet committed
    lanes = svc.mode.lane_log
    assert isinstance(lanes, ChangelogWriter)
    with pytest.raises(RuntimeError, match="only just after a commit"):
        lanes.let_go({1})


def test_a_rebalance_before_the_restore_throws_nothing_away_and_commits_nothing(
    restored: Changelog,
) -> None:
    """quix-streams#1146: a revocation landing while partitions wait for their restore. The ones
    revoked were never read; the rest are restored once, by the loop."""
    svc, member = Service(), Member()
    svc.handover.on_assign(member, [TopicPartition("handover.ingest", p) for p in (0, 1, 2)])
    revoke(svc, [2], member)
    assert svc.commits == [] and svc.handover.pending == {0, 1}
    assert svc.handover.restore_pending(member)
    assert restored.asked == [("handover-proc", [0, 1])] and svc.owned == {0, 1}


def test_a_restore_that_fails_on_a_transient_error_is_tried_again_not_crashed(
    restored: Changelog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous owner's transaction still open, the committed offsets time out: nothing was
    adopted, the partitions stay paused and pending, and a later step restores them."""
    svc, member = Service(), Member()
    now = [123.0]
    svc.handover.ctx = dataclasses.replace(svc.handover.ctx, clock=lambda: now[0])
    real = restored.restore

    def timing_out(partitions, on_contracts, on_waiting, wait_s):  # type: ignore[no-untyped-def]
        monkeypatch.setattr(sys.modules[__name__], "RESTORE", real)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "committed offsets timed out"))

    monkeypatch.setattr(sys.modules[__name__], "RESTORE", timing_out)
    svc.handover.on_assign(member, [TopicPartition("handover.ingest", p) for p in (0, 1)])
    assert svc.handover.restore_pending(member) is False
    assert svc.owned == frozenset() and svc.core.view.waiting().items == 0 and member.paused == {0, 1}
    assert svc.handover.restore_pending(member) is False  # not before a second has passed
    now[0] += 1.5
    assert svc.handover.restore_pending(member) is True
    assert svc.owned == {0, 1} and svc.core.view.waiting().items == 4 and member.paused == set()


def test_a_restore_beside_partitions_it_keeps_waits_briefly_for_offsets_so_they_go_on_dispatching(
    restored: Changelog,
) -> None:
    """A dead owner's open transaction holds the committed offsets back for up to its transaction
    timeout, and the restore runs on the loop: an instance that owns partitions must not stall them
    that long (bench_rebalance's kill during a restore: 9.4 s). Owning nothing, it waits in full."""
    svc, member = Service(), Member()
    assign(svc, [0], member)
    assign(svc, [1], member)
    assert restored.waits == [OFFSETS_WAIT_S, OFFSETS_WAIT_KEPT_S] and OFFSETS_WAIT_KEPT_S < RESTORE_RETRY_S


def test_a_fatal_error_in_a_restore_is_raised(restored: Changelog, monkeypatch: pytest.MonkeyPatch) -> None:
    def fenced(partitions, on_contracts, on_waiting, wait_s):  # type: ignore[no-untyped-def]
        raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))

    monkeypatch.setattr(sys.modules[__name__], "RESTORE", fenced)
    svc = Service()
    with pytest.raises(KafkaException, match="fenced"):
        assign(svc, [0])
