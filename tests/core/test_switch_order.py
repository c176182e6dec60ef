"""Rule 3's kept order (core/switch_order.py) against the reference scan it replaced.

The reference below is the scan dispatch ran before issue 25, kept verbatim: ``max`` and a stable
``sorted`` over every active shape of the model with the key (not on another consumer's shape,
waiting tokens), and under shares the jobs in the order the scan of the active shapes meets them,
most owed first. Random states are built by random submits (several models, shapes and jobs, lengths
that tie often and lengths only the bigger consumer holds), dispatches, completions, requeues,
retirements and releases, under every rule that orders switches: ``spread`` on and off, one consumer
or several of different sizes, jobs with weights and quotas, the deadline. Two checks:

* at every dispatch, for every consumer, the kept order's switch target is the reference's, on a
  copy of the scheduler (a quota's bookkeeping changes as lanes are asked, so each side asks its own);
* a scheduler that switches by the reference and one that switches by the kept order, driven by the
  same events, emit the same batches, one for one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.contract import Contract
from processor.core.dispatch import DispatchRules, DispatchSettings, _ahead
from processor.core.inflight import ConsumerState
from processor.core.item import Batch, Item
from processor.core.lane import Lane
from processor.core.lanes import LaneSettings, ShapeKey, ShapeLanes, key_job
from processor.core.scheduler import Scheduler
from processor.core.shares import Gate, JobPolicy, Shares, ShareSettings
from processor.core.switch_order import INELIGIBLE, Ineligible, SwitchOrder
from tests.core.helpers import make_contract

MODELS = ("m0", "m1")
JOBS = ("", "a", "b")


class ReferenceRules(DispatchRules):
    """Dispatch whose rule 3 is the scan over every active shape (what the kept order replaced)."""

    __slots__ = ()

    def _switch_target(
        self, state: ConsumerState, peers: list[ConsumerState]
    ) -> tuple[ShapeLanes, Lane] | None:
        active = self._active[state.contract.model]
        key = reference_switch_key(self, state, peers)
        best = max(active.values(), key=key)
        lane = self._eligible_lane(best, state.contract, peers)
        if lane is not None:
            return best, lane
        for sl in sorted(active.values(), key=key, reverse=True):
            lane = self._eligible_lane(sl, state.contract, peers)
            if lane is not None:
                return sl, lane
        return None

    def _shared_target(
        self, state: ConsumerState, active: dict[ShapeKey, ShapeLanes], peers: list[ConsumerState], gate: Gate
    ) -> tuple[ShapeLanes, Lane] | None:
        by_job: dict[str, list[ShapeLanes]] = {}
        for sl in active.values():
            by_job.setdefault(sl.job, []).append(sl)
        jobs = gate.order(by_job)
        switch_key = reference_switch_key(self, state, peers)
        own = key_job(state.shape) if state.shape is not None else None
        if own in by_job and own in jobs and gate.keeps(own, _ahead(state, peers, active, gate)):
            jobs.remove(own)
            jobs.insert(0, own)
        for job in jobs:
            for sl in sorted(by_job[job], key=switch_key, reverse=True):
                lane = self._eligible_lane(sl, state.contract, peers)
                if lane is not None and gate.allows(sl, lane):
                    return sl, lane
        return None


def reference_switch_key(
    rules: DispatchRules, state: ConsumerState, peers: list[ConsumerState]
) -> Callable[[ShapeLanes], tuple[bool, int]]:
    taken = (
        {p.shape for p in peers if p is not state and p.shape is not None}
        if rules.settings.spread and len(peers) > 1
        else set()
    )
    return lambda sl: (sl.key not in taken, sl.waiting_tokens)


def switch_target(sched: Scheduler, consumer: str, now_ms: int) -> tuple[ShapeKey, int] | None:
    """Rule 3's choice for ``consumer`` now (the shape and lane), by ``sched``'s own rules."""
    state = sched._context.consumers[consumer]
    model = state.contract.model
    active = sched._context.active.get(model)
    if not active:
        return None
    peers = sched._context.by_model[model]
    gate = sched._context.shares.gate(model, now_ms)
    rules = sched._rules
    if gate is None:
        found = rules._switch_target(state, peers)
    else:
        found = rules._shared_target(state, active, peers, gate)
    return None if found is None else (found[0].key, found[1].id)


def with_reference(sched: Scheduler) -> Scheduler:
    sched._rules.__class__ = ReferenceRules
    return sched


# -- random states ----------------------------------------------------------------------------------

lengths = st.one_of(st.sampled_from([1, 2, 3, 8, 16]), st.integers(1, 300))
submits = st.tuples(
    st.just("submit"),
    st.integers(0, 1),  # model, when two are in play
    st.integers(0, 7),  # shape
    st.integers(0, 2),  # job, of those in play
    st.lists(lengths, min_size=1, max_size=12),
)
dispatches = st.tuples(st.just("dispatch"), st.integers(0, 40))  # milliseconds advanced first
completes = st.tuples(st.just("complete"), st.integers(0, 10))
events = st.lists(
    st.one_of(
        *[submits] * 4,
        *[dispatches] * 3,
        *[completes] * 2,
        st.tuples(st.just("requeue"), st.integers(0, 10)),
        st.tuples(st.just("retire"), st.integers(0, 2)),
        st.tuples(st.just("release")),
    ),
    min_size=20,
    max_size=80,
)


@st.composite
def setups(draw: st.DrawFn) -> dict[str, object]:
    n = draw(st.integers(1, 3))
    two_models = draw(st.sampled_from([False, False, True]))
    contracts = [
        make_contract(
            f"c{i}",
            model=MODELS[i % 2] if two_models else MODELS[0],
            budget=draw(st.sampled_from([64, 256, 4096])),
            items=draw(st.integers(1, 4)),
            pad=draw(st.sampled_from([1, 8])),
            inflight=draw(st.integers(1, 2)),
        )
        for i in range(n)
    ]
    weights = st.one_of(st.just(JobPolicy()), st.builds(JobPolicy, weight=st.sampled_from([0.5, 2.0])))
    quotas = st.one_of(
        st.builds(JobPolicy, max_tokens=st.integers(0, 400)),
        st.builds(JobPolicy, max_tokens_per_s=st.sampled_from([100.0, 5000.0]), burst_ms=st.just(100)),
    )
    policy = draw(st.sampled_from([weights, st.one_of(weights, quotas)]))  # a quota: a gate for one job
    return {
        "policies": {job: draw(policy) for job in JOBS},
        "jobs": draw(st.sampled_from([("",), ("a",), JOBS])),  # one job: no gate without a quota
        "contracts": contracts,
        "slack": draw(st.sampled_from([0, 16, 65_536])),
        "lanes": LaneSettings(
            cut=draw(st.sampled_from(["length", "arrival"])),
            floor_tokens=draw(st.sampled_from([0, 1 << 20])),
            cap_tokens=1 << 20,
            idle_ms=draw(st.sampled_from([0, 50])),
        ),
        "dispatch": DispatchSettings(
            max_wait_ms=draw(st.sampled_from([1, 30, 60_000])),
            deadline=draw(st.sampled_from(["overtaking", "absolute"])),
            spread=draw(st.booleans()),
        ),
    }


def new_scheduler(setup: dict[str, object]) -> Scheduler:
    shares = Shares(ShareSettings(slack_tokens=setup["slack"]))  # type: ignore[arg-type]
    for job, policy in setup["policies"].items():  # type: ignore[attr-defined]
        shares.set_policy(job, policy)
    sched = Scheduler(setup["lanes"], setup["dispatch"], shares=shares)  # type: ignore[arg-type]
    for c in setup["contracts"]:  # type: ignore[attr-defined]
        sched.set_contract(c)
    return sched


def play(
    sched: Scheduler,
    setup: dict[str, object],
    script: list[tuple[object, ...]],
    check_state: Callable[[Scheduler, int], None] = lambda sched, now_ms: None,
) -> list[tuple[str, str, ShapeKey, int, list[str]]]:
    """Drive ``sched`` through ``script``, calling ``check_state`` after every event; returns every
    batch as (consumer, id, shape, lane, item ids)."""
    contracts: list[Contract] = setup["contracts"]  # type: ignore[assignment]
    out: list[tuple[str, str, ShapeKey, int, list[str]]] = []
    now = 0
    seq = 0
    for event in script:
        kind = event[0]
        if kind == "submit":
            _, model, shape, job_index, lens = event
            jobs: tuple[str, ...] = setup["jobs"]  # type: ignore[assignment]
            job = jobs[job_index % len(jobs)]  # type: ignore[operator]
            items = []
            for length in lens:  # type: ignore[attr-defined]
                seq += 1
                items.append(Item(f"i{seq}", MODELS[model], shape, length, now, job=job))  # type: ignore[arg-type, index]
            sched.submit_many(items, [now] * len(items))
        elif kind == "dispatch":
            now += event[1]  # type: ignore[operator]
            for b in sched.dispatch(now):
                out.append(batch_row(b))
        elif kind in ("complete", "requeue"):
            flying = sorted(sched.in_flight_batches(), key=lambda b: b.batch_id)
            if flying:
                batch = flying[event[1] % len(flying)]  # type: ignore[operator]
                if kind == "complete":
                    sched.complete(batch.batch_id, now)
                else:
                    sched.requeue(batch.batch_id, now)
        elif kind == "retire":
            contract = contracts[event[1] % len(contracts)]  # type: ignore[operator]
            sched.retire(contract.consumer, now)
            sched.set_contract(contract)
        else:
            sched.release_all()
        sched._context.order.check()
        sched.check()
        check_state(sched, now)
    return out


def batch_row(b: Batch) -> tuple[str, str, ShapeKey, int, list[str]]:
    return (b.consumer, b.batch_id, (b.model, b.shape), b.lane, [it.id for it in b.items])


def reference_target(sched: Scheduler, consumer: str, now_ms: int) -> tuple[ShapeKey, int] | None:
    """:func:`switch_target` by the reference scan; on a copy of ``sched`` when a job has a quota
    (asking a quota's lanes updates its bookkeeping, so each side must ask its own)."""
    if sched._context.shares.quota_count:
        return switch_target(with_reference(copy.deepcopy(sched)), consumer, now_ms)
    sched._rules.__class__ = ReferenceRules
    try:
        return switch_target(sched, consumer, now_ms)
    finally:
        sched._rules.__class__ = DispatchRules


def assert_same_targets(sched: Scheduler, now_ms: int) -> None:
    """For every consumer: the kept order's switch target equals the reference scan's."""
    for consumer in list(sched._context.consumers):
        expected = reference_target(sched, consumer, now_ms)
        kept = copy.deepcopy(sched) if sched._context.shares.quota_count else sched
        assert switch_target(kept, consumer, now_ms) == expected


# -- the properties ---------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(setup=setups(), script=events)
def test_kept_order_chooses_the_reference_scans_shape(
    setup: dict[str, object], script: list[tuple[object, ...]]
) -> None:
    play(new_scheduler(setup), setup, script, assert_same_targets)


@settings(max_examples=100, deadline=None)
@given(setup=setups(), script=events)
def test_kept_order_emits_the_reference_scans_batches(
    setup: dict[str, object], script: list[tuple[object, ...]]
) -> None:
    kept = play(new_scheduler(setup), setup, script)
    reference = play(with_reference(new_scheduler(setup)), setup, script)
    assert kept == reference


# -- scenarios --------------------------------------------------------------------------------------


def shape_lanes(key: ShapeKey, tokens: int) -> ShapeLanes:
    sl = ShapeLanes(key)
    sl.waiting_items = 1
    sl.waiting_tokens = tokens
    return sl


def test_ties_go_to_the_shape_active_first_and_taken_shapes_come_last() -> None:
    order = SwitchOrder()
    first, second, third = (shape_lanes(("m", k), 10) for k in (1, 2, 3))
    for sl in (first, second, third):
        order.placed(sl, True)
    seen: list[ShapeKey] = []

    def refuse(sl: ShapeLanes) -> None:
        seen.append(sl.key)

    assert order.first("m", "", {("m", 1)}, refuse) is None
    assert seen == [("m", 2), ("m", 3), ("m", 1)]
    assert order.first("m", "", set(), lambda sl: sl.key) == ("m", 1)  # refusals put nothing out of order
    order.check()


def test_a_change_of_waiting_tokens_moves_a_shape_and_a_drained_one_leaves() -> None:
    order = SwitchOrder()
    small, big = shape_lanes(("m", 1), 5), shape_lanes(("m", 2), 50)
    order.placed(small, True)
    order.placed(big, True)
    assert order.first("m", "", set(), lambda sl: sl) is big
    small.waiting_tokens = 500
    order.placed(small, False)
    assert order.first("m", "", set(), lambda sl: sl) is small
    small.waiting_items = small.waiting_tokens = 0
    order.taken_from(small)
    assert order.first("m", "", set(), lambda sl: sl) is big
    order.check()


def test_stale_entries_are_compacted_so_the_heap_stays_near_its_live_shapes() -> None:
    order = SwitchOrder()
    sl = shape_lanes(("m", 1), 1)
    order.placed(sl, True)
    for tokens in range(2, 10_000):
        sl.waiting_tokens = tokens
        order.placed(sl, False)
        assert order.first("m", "", set(), lambda s: s) is sl  # a read pushes the noted change
    assert len(order.jobs("m")[""].heap) <= 2 + 64
    order.check()


def test_a_change_is_noted_once_and_pushed_when_the_order_is_next_read() -> None:
    order = SwitchOrder()
    small, big = shape_lanes(("m", 1), 10), shape_lanes(("m", 2), 20)
    order.placed(small, True)
    order.placed(big, True)
    for tokens in range(30, 1_000):  # a run of submits to one shape: one note, no push
        small.waiting_tokens = tokens
        order.placed(small, False)
    js = order.jobs("m")[""]
    assert js.dirty == [small, big] and js.heap == []
    assert order.first("m", "", set(), lambda s: s) is small
    assert js.dirty == [] and len(js.heap) == 2
    order.check()


def test_notes_stay_bounded_through_drains_and_refills_that_nothing_reads() -> None:
    order = SwitchOrder()
    shapes = [shape_lanes(("m", n), 1) for n in range(10)]
    for sl in shapes:
        order.placed(sl, True)
    for cycle in range(5_000):
        sl = shapes[cycle % 10]
        sl.waiting_items = sl.waiting_tokens = 0
        order.taken_from(sl)
        sl.waiting_items, sl.waiting_tokens = 1, cycle + 2
        order.placed(sl, True)
        assert len(order.jobs("m")[""].dirty) <= 10
    assert order.first("m", "", set(), lambda s: s) is shapes[9]  # the most tokens: the last refilled
    order.check()


def test_jobs_come_in_the_order_of_their_oldest_active_shape() -> None:
    order = SwitchOrder()
    a1, b1, a2 = shape_lanes(("m", 1, "a"), 1), shape_lanes(("m", 2, "b"), 1), shape_lanes(("m", 3, "a"), 1)
    for sl in (a1, b1, a2):
        order.placed(sl, True)
    assert list(order.jobs("m")) == ["a", "b"]
    a1.waiting_items = a1.waiting_tokens = 0
    order.taken_from(a1)  # job a's oldest active shape is now a2, activated after b1
    assert list(order.jobs("m")) == ["b", "a"]


def test_a_shape_no_lane_of_which_a_consumer_may_take_is_parked_for_consumers_no_bigger() -> None:
    order = SwitchOrder()
    long_one, short_one = shape_lanes(("m", 1), 900), shape_lanes(("m", 2), 100)
    order.placed(long_one, True)
    order.placed(short_one, True)
    asked: list[ShapeLanes] = []

    def small(sl: ShapeLanes) -> ShapeLanes | Ineligible:  # holds nothing longer than 500 tokens
        asked.append(sl)
        return INELIGIBLE if sl.waiting_tokens > 500 else sl

    assert order.first("m", "", set(), small, 500) is short_one
    assert asked == [long_one, short_one]
    asked.clear()
    assert order.first("m", "", set(), small, 500) is short_one
    assert order.first("m", "", set(), small, 400) is short_one  # a smaller card skips it too
    assert asked == [short_one, short_one]  # the parked shape is not asked again
    assert order.first("m", "", set(), lambda sl: sl, 1000) is long_one  # a bigger one meets it first
    assert order.first("m", "", set(), lambda sl: sl, None) is long_one  # as does memory mode
    order.check()
    long_one.waiting_tokens = 300  # its tokens changed: a new entry, in the order every card reads
    order.placed(long_one, False)
    assert order.first("m", "", set(), small, 500) is long_one
    order.check()


def test_a_consumer_that_comes_or_goes_unparks_every_shape_of_its_model() -> None:
    sched = Scheduler()
    sched.set_contract(make_contract("small", budget=512, items=4, pad=1))
    sched.set_contract(make_contract("big", budget=4096, items=4, pad=1))
    sched.submit_many([Item("a", "m", 1, 900, 0), Item("b", "m", 2, 100, 0)], [0, 0])
    js = sched._context.order.jobs("m")[""]
    batch = sched.next_batch("small", 0)
    assert batch is not None and batch.shape == 2
    assert list(js.parked) == [512]  # the small card parked shape 1 on its way
    sched.retire("big", 0)  # nobody holds shape 1 now: the small card takes it, oversized
    assert js.parked == {}
    sched.complete(batch.batch_id, 1)
    again = sched.next_batch("small", 1)
    assert again is not None and again.shape == 1 and again.oversized
    sched.check()
