"""Builders and checks shared by the scheduling-core tests (contract, lanes, dispatch, properties).

Nothing here asserts a rule by itself except :func:`assert_batch_ok`, which is an independent restatement
of the batch invariant (it does not call ``check_batch``), so a test that uses it checks the core against
the documented rule rather than against itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from processor.core.contract import Contract, round_up
from processor.core.item import Batch, Item
from processor.core.lanes import LaneSettings, LaneTable, ShapeLanes
from processor.core.scheduler import DispatchSettings, Scheduler
from processor.sim.traces import TraceRecord

MODEL = "m"
SHAPE_A, SHAPE_B, SHAPE_C = 0xA, 0xB, 0xC

_ids = itertools.count()


def make_item(
    length: int, *, shape: int = SHAPE_A, model: str = MODEL, t: int = 0, id: str | None = None
) -> Item:
    """An item with a fresh unique id unless one is given."""
    return Item(id if id is not None else f"i{next(_ids)}", model, shape, length, t)


def make_items(lengths: Iterable[int], **kwargs: object) -> list[Item]:
    return [make_item(n, **kwargs) for n in lengths]  # type: ignore[arg-type]


def items_from_records(records: Iterable[TraceRecord]) -> list[Item]:
    return [Item(r.id, r.model, r.shape, r.length, r.t_ms) for r in records]


def make_contract(
    consumer: str = "c",
    *,
    model: str = MODEL,
    budget: int = 4096,
    items: int = 64,
    pad: int = 8,
    inflight: int = 2,
) -> Contract:
    return Contract(
        consumer, model, budget_tokens=budget, max_items=items, pad_multiple=pad, max_inflight=inflight
    )


def make_scheduler(
    *contracts: Contract,
    lanes: LaneSettings | None = None,
    max_wait_ms: int = 60_000,
    deadline: str = "overtaking",
    spread: bool = True,
) -> Scheduler:
    sched = Scheduler(lanes, DispatchSettings(max_wait_ms=max_wait_ms, deadline=deadline, spread=spread))
    for c in contracts:
        sched.set_contract(c)
    return sched


def submit_all(sched: Scheduler, items: Iterable[Item], now_ms: int = 0) -> list[Item]:
    items = list(items)
    for it in items:
        sched.submit(it, now_ms)
    return items


def complete_all(sched: Scheduler, batches: Iterable[Batch], now_ms: int) -> None:
    for b in batches:
        assert sched.complete(b.batch_id, now_ms) is b


def drain(sched: Scheduler, now_ms: int = 0, *, step_ms: int = 1, max_rounds: int = 100_000) -> list[Batch]:
    """Dispatch and complete until nothing waits or is in flight; returns every batch, in order."""
    out: list[Batch] = []
    for _ in range(max_rounds):
        batches = sched.dispatch(now_ms)
        if not batches and not any(True for _ in sched.in_flight_batches()):
            return out
        out.extend(batches)
        now_ms += step_ms
        complete_all(sched, list(sched.in_flight_batches()), now_ms)
    raise AssertionError(f"drain: still busy after {max_rounds} rounds")


def assert_batch_ok(batch: Batch, contract: Contract) -> None:
    """The batch rule, restated: one model, one shape, one lane; fits the contract unless single oversized."""
    items = batch.items
    assert items, f"{batch.batch_id}: empty"
    assert {(it.model, it.shape, it.lane) for it in items} == {(batch.model, batch.shape, batch.lane)}, batch
    assert batch.model == contract.model
    assert len(items) <= contract.max_items
    longest = max(it.length for it in items)
    assert batch.padded_length == round_up(longest, contract.pad_multiple)
    if batch.oversized:
        assert len(items) == 1 and batch.padded_tokens > contract.budget_tokens
    else:
        assert batch.padded_tokens <= contract.budget_tokens


def lane_of(table: LaneTable, item: Item) -> tuple[ShapeLanes, int]:
    """The shape lanes holding ``item`` and its lane's representative length."""
    sl = table.shapes[(item.model, item.shape)]
    return sl, sl.lanes[item.lane].rep


def reps(table: LaneTable, model: str = MODEL, shape: int = SHAPE_A) -> dict[int, int]:
    """Lane id -> representative length for one shape."""
    return {lane_id: lane.rep for lane_id, lane in table.shapes[(model, shape)].lanes.items()}
