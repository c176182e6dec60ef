"""Properties of the scheduling core over random item streams, contracts and event interleavings.

The state machine drives a ``Scheduler`` with random submits, dispatches, completions (whole batch or
item by item, some failed), ticks, retirements and re-hirings, and after every step checks:

* ``Scheduler.check()`` passes: the ledger balances and matches what the lanes and batches hold;
* every emitted batch is one model, one shape, one lane, within its contract (or a single oversized item);
* no lane's representative length ever shrinks, lane ids stay below the lane budget, and lanes never
  merge: a lane disappears only by going quiet (empty, counted as an idle reclaim).

At teardown it hires everyone back, drains, and checks that every item was dispatched once plus once
per requeue, and finished (completed or failed) exactly once.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from processor.core.contract import Contract
from processor.core.item import Batch, Item
from processor.core.lane import Lane
from processor.core.lanes import CUT_ORDERS, LaneSettings
from processor.core.scheduler import DEADLINES, DispatchSettings, Scheduler
from tests.core.helpers import assert_batch_ok, complete_all, make_contract, make_item

MODELS = ("m0", "m1")
SHAPES = (0x1, 0x2)

lengths = st.one_of(st.integers(1, 600), st.integers(1, 50_000))


@st.composite
def contracts(draw: st.DrawFn) -> list[Contract]:
    n = draw(st.integers(1, 3))
    two_models = draw(st.booleans())
    return [
        Contract(
            f"c{i}",
            MODELS[i % 2] if two_models and n > 1 else MODELS[0],
            budget_tokens=draw(st.integers(256, 65_536)),
            max_items=draw(st.integers(1, 32)),
            pad_multiple=draw(st.sampled_from([1, 8, 16, 64])),
            max_inflight=draw(st.integers(1, 3)),
        )
        for i in range(n)
    ]


@st.composite
def lane_settings(draw: st.DrawFn) -> LaneSettings:
    floor = draw(st.sampled_from([0, 8, 64, 1 << 20]))  # 1 << 20: one lane per shape (the default)
    start = draw(st.floats(0.0, 0.01))
    return LaneSettings(
        lane_budget=draw(st.sampled_from([1, 2, 3, 16])),
        pad_multiple=draw(st.sampled_from([1, 8, 64])),
        floor_tokens=floor,
        cap_tokens=draw(st.integers(floor, max(512, floor))),
        start_ratio=start,
        full_ratio=draw(st.floats(start, 0.2)),
        idle_ms=draw(st.sampled_from([0, 50, 3000])),
        cut=draw(st.sampled_from(CUT_ORDERS)),
        cut_tokens=draw(st.sampled_from([0, 64, 10**6])),
        cut_ratio=draw(st.sampled_from([0.0, 0.015, 1.0])),
    )


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        contracts=contracts(),
        lanes=lane_settings(),
        max_wait_ms=st.integers(1, 500),
        deadline=st.sampled_from(DEADLINES),
        spread=st.booleans(),
    )
    def setup(
        self, contracts: list[Contract], lanes: LaneSettings, max_wait_ms: int, deadline: str, spread: bool
    ) -> None:
        self.sched = Scheduler(lanes, DispatchSettings(max_wait_ms, deadline, spread), batch_prefix="p")
        self.hired: dict[str, Contract] = {}
        self.retired: dict[str, Contract] = {}
        for c in contracts:
            self.hire(c)
        self.models = sorted({c.model for c in contracts})
        self.now = 0
        self.items: dict[str, Item] = {}
        self.outstanding: dict[str, set[str]] = {}  # batch id -> item ids not yet finished
        self.finished_batches: list[str] = []
        self.dispatched: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.requeued: Counter[str] = Counter()
        self.reps: dict[int, tuple[Lane, int]] = {}  # id(lane) -> (lane, largest rep seen); lanes kept alive
        self.live: set[int] = set()  # id() of the lanes that existed at the last check
        self.reclaims = 0

    def hire(self, contract: Contract) -> None:
        self.sched.set_contract(contract)
        self.hired[contract.consumer] = contract
        self.retired.pop(contract.consumer, None)

    def advance(self, dt: int) -> int:
        self.now += dt
        return self.now

    def record(self, batches: list[Batch]) -> None:
        for b in batches:
            assert_batch_ok(b, self.hired[b.consumer])
            self.outstanding[b.batch_id] = {it.id for it in b.items}
            self.dispatched.update(it.id for it in b.items)

    def finish(self, batch_id: str, item_ids: set[str]) -> None:
        self.finished.update(item_ids)
        self.outstanding[batch_id] -= item_ids
        if not self.outstanding[batch_id]:
            del self.outstanding[batch_id]
            self.finished_batches.append(batch_id)

    # -- events ---------------------------------------------------------------------------------

    @rule(
        lengths=st.lists(lengths, min_size=1, max_size=8),
        shape=st.sampled_from(SHAPES),
        model=st.integers(0, 1),
        dt=st.integers(0, 60),
    )
    def submit(self, lengths: list[int], shape: int, model: int, dt: int) -> None:
        now = self.advance(dt)
        for n in lengths:
            item = make_item(n, shape=shape, model=self.models[model % len(self.models)], t=now)
            self.items[item.id] = item
            self.sched.submit(item, now)

    @rule(dt=st.integers(0, 300))
    def dispatch(self, dt: int) -> None:
        self.record(self.sched.dispatch(self.advance(dt)))

    @precondition(lambda self: self.outstanding)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        batch_id = data.draw(st.sampled_from(sorted(self.outstanding)))
        pending = self.outstanding[batch_id]
        failed = data.draw(st.sets(st.sampled_from(sorted(pending))))
        batch = self.sched.complete(batch_id, self.advance(1), failed=failed)
        assert batch is not None and batch.batch_id == batch_id
        self.finish(batch_id, set(pending))

    @precondition(lambda self: self.outstanding)
    @rule(data=st.data(), ok=st.booleans())
    def item_done(self, data: st.DataObject, ok: bool) -> None:
        batch_id = data.draw(st.sampled_from(sorted(self.outstanding)))
        item_id = data.draw(st.sampled_from(sorted(self.outstanding[batch_id])))
        last = len(self.outstanding[batch_id]) == 1
        assert self.sched.item_done(batch_id, item_id, ok, self.advance(1)) is last
        assert self.sched.item_done(batch_id, item_id, ok, self.now) is None  # a duplicate
        self.finish(batch_id, {item_id})

    @precondition(lambda self: self.finished_batches)
    @rule(data=st.data())
    def duplicate_complete(self, data: st.DataObject) -> None:
        assert self.sched.complete(data.draw(st.sampled_from(self.finished_batches)), self.now) is None

    @rule(dt=st.integers(0, 500))
    def tick(self, dt: int) -> None:
        self.sched.tick(self.advance(dt))

    @precondition(lambda self: self.hired)
    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.hired)))
        held = {b.batch_id for b in self.sched.in_flight_batches() if b.consumer == name}
        returned = self.sched.retire(name, self.now)
        assert {b.batch_id for b in returned} == held
        for batch_id in held:
            self.requeued.update(self.outstanding.pop(batch_id))
        self.retired[name] = self.hired.pop(name)

    @precondition(lambda self: self.retired)
    @rule(data=st.data())
    def rehire(self, data: st.DataObject) -> None:
        self.hire(self.retired[data.draw(st.sampled_from(sorted(self.retired)))])

    # -- after every step -----------------------------------------------------------------------

    @invariant()
    def accounts_balance(self) -> None:
        if hasattr(self, "sched"):
            self.sched.check()

    @invariant()
    def lanes_only_grow_and_never_merge(self) -> None:
        if not hasattr(self, "sched"):
            return
        table = self.sched._context.table
        live = set()
        for sl in table.shapes.values():
            for lane in sl.lanes.values():
                _, seen = self.reps.get(id(lane), (lane, 0))
                assert lane.rep >= seen, f"lane {sl.key}/{lane.id} shrank from {seen} to {lane.rep}"
                assert 0 <= lane.id < table.settings.lane_budget
                self.reps[id(lane)] = (lane, lane.rep)
                live.add(id(lane))
        # A lane only ever disappears by going quiet: empty, and counted as an idle reclaim.
        gone = self.live - live
        assert all(not self.reps[key][0].items for key in gone)
        assert len(gone) == table.stats.idle_reclaims - self.reclaims
        self.live, self.reclaims = live, table.stats.idle_reclaims
        assert table.stats.lanes_in_use == len(live)

    # -- the end --------------------------------------------------------------------------------

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        for contract in list(self.retired.values()):
            self.hire(contract)
        sched = self.sched
        for _ in range(100_000):
            batches = sched.dispatch(self.advance(1))
            self.record(batches)
            flying = list(sched.in_flight_batches())
            if not flying:
                break
            complete_all(sched, flying, self.advance(1))
            for b in flying:
                self.finish(b.batch_id, set(self.outstanding[b.batch_id]))
            sched.check()
        assert sched.view.waiting().items == 0 and not self.outstanding
        for item_id in self.items:
            assert self.finished[item_id] == 1, item_id
            assert self.dispatched[item_id] == 1 + self.requeued[item_id], item_id
        ledger = sched._context.ledger
        received, completed, failed = (ledger.total(s) for s in ("received", "completed", "failed"))
        assert received.items == len(self.items) == completed.items + failed.items
        assert received.tokens == completed.tokens + failed.tokens
        redelivered = sum(c.redelivered.items for c in ledger.consumers.values())
        assert redelivered == sum(self.requeued.values())
        sched.check()


SchedulerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestSchedulerProperties = SchedulerMachine.TestCase


# ------------------------------------------------------------------------------ bounded waits

HOT, COLD_SHAPES = 0xF0, (0xC1, 0xC2, 0xC3)
STEP_MS = 10


@settings(max_examples=60, deadline=None)
@given(
    hot_per_step=st.lists(st.integers(1, 4), min_size=10, max_size=120),
    cold=st.lists(
        st.tuples(st.integers(0, 119), st.sampled_from(COLD_SHAPES), st.sampled_from([50, 400, 3000])),
        max_size=12,
    ),
    max_wait_ms=st.integers(20, 200),
    deadline=st.sampled_from(DEADLINES),
)
def test_single_consumer_wait_is_bounded_under_continuous_arrivals(
    hot_per_step: list[int], cold: list[tuple[int, int, int]], max_wait_ms: int, deadline: str
) -> None:
    """One consumer, one batch per step; a hot shape gets new items every step, cold items now and then.

    Without the deadline rule the consumer would stick to the hot shape and cold items would wait forever.
    With it, every item waits at most about max_wait x (number of shapes) plus a step per cold lane.
    """
    contract = make_contract(budget=1 << 20, items=1024, inflight=1)
    sched = Scheduler(None, DispatchSettings(max_wait_ms, deadline))
    sched.set_contract(contract)
    arrivals: dict[int, list[Item]] = {}
    for step, shape, length in cold:
        arrivals.setdefault(step, []).append(make_item(length, shape=shape))
    unserved = {it.id for items in arrivals.values() for it in items}
    # dispatch.py: max_wait x (1 + other shapes holding older overdue items), each rounded up to a step,
    # plus a step for every cold lane the consumer may serve on the way and one batch.
    other_shapes = len({shape for _, shape, _ in cold})  # the hot shape plus the cold ones, less one
    bound = (1 + other_shapes) * (max_wait_ms + STEP_MS) + (len(cold) + 2) * STEP_MS

    worst = 0
    step = 0
    while step < len(hot_per_step) or unserved or sched.view.waiting().items:
        assert step < 10_000, "items still waiting after 10,000 steps"
        now = step * STEP_MS
        complete_all(sched, list(sched.in_flight_batches()), now)
        hot = hot_per_step[step] if step < len(hot_per_step) else 1  # arrivals continue until cold is served
        new = [make_item(100, shape=HOT) for _ in range(hot)] + arrivals.get(step, [])
        for item in new:
            item.arrival_ms = now
            sched.submit(item, now)
        for batch in sched.dispatch(now):
            assert_batch_ok(batch, contract)
            for item in batch.items:
                worst = max(worst, now - item.arrival_ms)
                unserved.discard(item.id)
        if step >= len(hot_per_step) and not unserved:
            break
        step += 1
    target(worst / bound, label="worst wait / bound")
    assert worst <= bound, f"an item waited {worst} ms, bound {bound} ms"
