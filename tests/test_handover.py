"""Handing lane state between processor instances, without Kafka: credits, the changelog fold, and the
scheduler's release/adopt with the ledger balancing throughout."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from processor.core.item import Batch
from processor.core.scheduler import Scheduler
from processor.state import changelog
from processor.state.credits import CreditBook, slot_partition
from tests.helpers_core import MODEL, make_contract, make_items, make_scheduler, submit_all

# -- credits -----------------------------------------------------------------------------------


@given(st.integers(1, 64), st.integers(1, 64), st.data())
def test_every_slot_has_exactly_one_owner_however_partitions_are_split(
    max_inflight: int, partitions: int, data: st.DataObject
) -> None:
    owner = data.draw(st.lists(st.integers(0, 3), min_size=partitions, max_size=partitions))
    books = [
        CreditBook(partitions, frozenset(p for p in range(partitions) if owner[p] == i)) for i in range(4)
    ]
    shares = [b.share(max_inflight) for b in books]
    assert sum(shares) == max_inflight  # never more batches than the consumer promised to hold
    owned = [set(b.owned_slots(max_inflight)) for b in books]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not owned[i] & owned[j]


@given(st.integers(1, 16), st.integers(1, 8))
def test_contiguous_ranges_give_every_instance_a_slot_when_partitions_divide_evenly(
    instances: int, per_instance: int
) -> None:
    partitions = instances * per_instance
    for max_inflight in range(instances, instances * 3 + 1):
        for i in range(instances):
            block = frozenset(range(i * per_instance, (i + 1) * per_instance))
            assert CreditBook(partitions, block).share(max_inflight) >= 1, (max_inflight, i)


def test_slots_spread_over_partitions() -> None:
    assert [slot_partition(j, 2, 8) for j in range(2)] == [2, 6]
    assert [slot_partition(j, 3, 8) for j in range(3)] == [1, 4, 6]
    assert [slot_partition(j, 4, 2) for j in range(4)] == [0, 0, 1, 1]


def test_take_uses_owned_slots_only_and_refuses_past_the_share() -> None:
    book = CreditBook(4, frozenset({0, 1}))
    slot, partition = book.take("c", 4, "b1")
    assert (slot, partition) == (0, 0)
    assert book.take("c", 4, "b2") == (1, 1)
    try:
        book.take("c", 4, "b3")
    except RuntimeError as exc:
        assert "no free in-flight slot of the 2" in str(exc)
    else:
        raise AssertionError("a third batch must not get a slot of the other instance's partitions")
    book.free("b1")
    assert book.take("c", 4, "b3") == (0, 0)


def test_an_adopted_batch_whose_slot_is_gone_still_counts() -> None:
    book = CreditBook(2, frozenset({0, 1}))
    assert book.adopt("c", 0, "b1") == 0
    placeholder = book.adopt("c", 0, "b2")  # same slot recorded twice: the consumer shrank max_inflight
    assert placeholder < 0
    assert book.held("c") == 2
    book.free("b2")
    assert book.held("c") == 1


# -- the changelog fold ------------------------------------------------------------------------


def test_a_tombstone_ends_a_record_only_in_its_own_partition() -> None:
    """An item dispatched from its home partition 1, then put back by a batch whose record lives in
    partition 3: the tombstone in 1 must not erase the new record in 3, in either reading order."""
    key = changelog.waiting_key(1, 42)
    for order in ([(3, changelog.PRESENT), (1, None)], [(1, None), (3, changelog.PRESENT)]):
        state = changelog.ChangelogState()
        for partition, value in order:
            state.apply(key, value, partition)
        assert state.waiting == {(1, 42): 3}


def test_batch_entry_round_trips_its_slot_progress_and_results_position() -> None:
    entry = changelog.BatchEntry("b1", "card", 3, 128, 8, 1000, False, ((0, 5), (0, 6)), 2, (1,), ((0, 17),))
    state = changelog.ChangelogState()
    state.apply(changelog.batch_key("b1"), entry.value(), 4)
    assert state.batches["b1"] == entry
    assert state.homes["b1"] == 4
    assert state.batch_refs() == {(0, 5), (0, 6)}


@given(
    st.text(min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(0, 63), st.integers(0, 1 << 62)), min_size=1, max_size=40),
    st.lists(st.tuples(st.integers(0, 63), st.integers(0, 1 << 62)), max_size=4),
    st.integers(-1, 255),
    st.booleans(),
    st.data(),
)
def test_binary_batch_entries_round_trip(
    consumer: str,
    refs: list[tuple[int, int]],
    results_from: list[tuple[int, int]],
    slot: int,
    oversized: bool,
    data: st.DataObject,
) -> None:
    done = tuple(sorted(data.draw(st.sets(st.integers(0, len(refs) - 1)))))
    entry = changelog.BatchEntry(
        "b", consumer, 7, 1 << 20, 64, 1 << 41, oversized, tuple(refs), slot, done, tuple(results_from)
    )
    value = entry.value()
    assert value[0] == changelog.BATCH_FORMAT
    assert changelog.BatchEntry.parse("b", value) == entry


def _fold(state: changelog.ChangelogState, records: list[tuple[int, bytes, bytes | None]]) -> None:
    for partition, key, value in records:
        state.apply(key, value, partition)


@given(
    st.lists(
        st.lists(
            st.tuples(
                st.booleans(),
                st.integers(0, 2),
                st.integers(0, 2),
                st.sampled_from([0, 1, 7, 8, 65_535, 65_536, 65_537, 1 << 40]),
            ),
            max_size=30,
        ),
        max_size=6,
    )
)
def test_waiting_sets_fold_back_into_exactly_the_waiting_items(
    transactions: list[list[tuple[bool, int, int, int]]],
) -> None:
    """Whatever is added and removed, across any number of commits, the records a commit writes fold
    into the items waiting at that commit, each with its home, and a chunk emptied is tombstoned."""
    sets = changelog.WaitingSets()
    state = changelog.ChangelogState()
    model: dict[tuple[int, int], int] = {}
    for changes in transactions:
        for add, home, partition, offset in changes:
            ref = (partition, offset)
            if add and ref not in model:
                sets.add_all([changelog.WaitingRef(home, partition, offset)])
                model[ref] = home
            elif not add and ref in model:
                sets.discard_all([changelog.WaitingRef(model.pop(ref), partition, offset)])
        _fold(state, sets.flush())
        assert state.waiting == model
        assert len(sets) == len(model)
    assert sets.flush() == []
    if not model:
        assert state.chunks == {}


def test_legacy_waiting_records_are_rewritten_into_chunks_and_tombstoned() -> None:
    state = changelog.ChangelogState()
    _fold(
        state,
        [
            (1, changelog.waiting_key(1, 5), changelog.PRESENT),
            (3, changelog.waiting_key(0, 70_000), changelog.PRESENT),
        ],
    )
    assert state.waiting == {(1, 5): 1, (0, 70_000): 3}
    sets = changelog.WaitingSets()
    sets.load(state)
    records = sets.flush()
    assert sorted(key[:1] for _p, key, _v in records) == [b"S", b"S", b"W", b"W"]
    _fold(state, records)
    assert state.legacy_waiting == {}
    assert state.waiting == {(1, 5): 1, (0, 70_000): 3}


def test_entries_written_before_slots_existed_still_parse() -> None:
    legacy = (
        b'{"consumer":"c","lane":0,"padded_length":8,"pad_multiple":8,"created_ms":1,'
        b'"oversized":false,"refs":[[0,1]]}'
    )
    entry = changelog.BatchEntry.parse("b", legacy)
    assert (entry.slot, entry.done, entry.results_from) == (-1, (), ())


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
    before = sched.ledger.handover_delta()

    sched.release_all()
    sched.check(deep=True)
    assert sched.table.waiting_items == 0 and not list(sched.in_flight_batches())

    for it in waiting:
        sched.adopt_waiting(it, 2)
    assert sched.adopt_in_flight(batch, 2, set(done))
    sched.check(deep=True)
    assert sched.ledger.handover_delta() == before  # adopted exactly what was released
    # the answered item stays answered: its replayed completion is not counted twice
    assert sched.item_done(batch.batch_id, first.id, True, 3) is None
    assert sched.item_done(batch.batch_id, batch.items[1].id, True, 3) is True
    completed = sched.ledger.total("completed")
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
    assert other.table.waiting_items == 1  # only the unanswered item waits again
    other.check(deep=True)


# -- the watchdog ------------------------------------------------------------------------------


def test_the_watchdog_reports_a_call_stuck_past_its_limit_once_and_ignores_quick_ones() -> None:
    import time

    from processor.kafka.watchdog import CallWatchdog

    stuck: list[str] = []
    dog = CallWatchdog(0.2, on_stuck=lambda what, _s: stuck.append(what))
    with dog.guard("quick"):
        pass
    with dog.guard("slow commit"):
        time.sleep(0.6)
    time.sleep(0.2)
    assert stuck == ["slow commit"]


def test_status_counts_adopted_state_once_while_the_old_owner_is_down() -> None:
    """a crashed holding 10 waiting items; b adopted them. Until a restarts and releases, both
    checkpoints claim the 10; the view (and the audit) must count them once."""
    from processor.cli.status import render
    from processor.ops.status import StatusView
    from processor.wire.records import LedgerSnapshotRecord

    def checkpoint(name: str, counters: dict[str, int], slots: int) -> LedgerSnapshotRecord:
        per_consumer = {"c": {"slots": slots, "in_flight_batches": 0}}
        return LedgerSnapshotRecord(
            instance=name, taken_ms=0, sequence=1, counters=counters, per_model={}, per_consumer=per_consumer
        )

    view = StatusView()
    view.checkpoints["a"] = checkpoint("a", {"queued_items": 10, "queued_tokens": 500}, 1)
    view.checkpoints["b"] = checkpoint(
        "b",
        {"queued_items": 12, "queued_tokens": 600, "adopted_queued_items": 10, "adopted_queued_tokens": 500},
        1,
    )
    assert (view.held("queued_items"), view.held("queued_tokens")) == (12, 600)
    view.checkpoints["a"] = checkpoint(
        "a", {"queued_items": 0, "released_queued_items": 10, "released_queued_tokens": 500}, 1
    )
    assert view.held("queued_items") == 12
    render(view)  # renders with several instances without raising
