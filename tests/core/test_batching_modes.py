"""Batching modes in the core: rows, tokens and memory, from the contract's rule to the scheduler and
the checks at both ends (processor/core/contract.py, processor/core/scheduler.py).

Every batch the scheduler emits is checked against :func:`within_mode`, a restatement of each mode's
rule written here from docs/consumer-contract.md (it does not call ``BatchRule``), so the tests check
the core against the documented rule rather than against itself. The same modes on the wire, in the
simulator and on the command line: tests/wire/test_control.py, tests/sim/test_batching_modes.py,
tests/cli/test_simulate.py and tests/cli/test_consumer.py."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.contract import (
    BATCHING_MODES,
    Contract,
    InvariantViolation,
    check_batch,
    contract_violation,
    round_up,
)
from processor.core.item import Batch, Item
from processor.core.lanes import LaneSettings, LaneTable
from processor.sim.baselines import pack_prefix
from processor.wire.records import BatchRecord, TokenItemRecord, tokens_from_ids
from tests.core.helpers import MODEL, SHAPE_A, SHAPE_B, drain, make_scheduler, submit_all

KV = 1_000  # bytes per token in the memory scenarios: loads read as thousands of tokens

_ids = itertools.count()


def item(length: int, output: int | None = None, *, shape: int = SHAPE_A) -> Item:
    return Item(f"i{next(_ids)}", MODEL, shape, length, 0, None, output)


def contract(mode: str = "tokens", consumer: str = "c", **fields: Any) -> Contract:
    base: dict[str, Any] = {"budget_tokens": 4096, "max_items": 64, "pad_multiple": 8, "max_inflight": 2}
    if mode == "memory":
        base |= {"memory_bytes": 100_000 * KV // 100, "kv_bytes_per_token": KV}
    return Contract(consumer, MODEL, **{**base, **fields, "batching": mode})


def counted_output(it: Item | TokenItemRecord, c: Contract) -> int:
    budget = it.output_budget
    return c.default_output_tokens if budget is None else max(budget, 0)


def within_mode(c: Contract, n: int, padded_length: int, outputs: int) -> bool:
    """The documented rule of each mode for ``n`` items padded to ``padded_length``."""
    if n > c.max_items:
        return False
    if c.batching == "rows":
        return True
    if c.batching == "tokens":
        return n * padded_length <= c.budget_tokens
    return (n * padded_length + outputs) * c.kv_bytes_per_token <= c.memory_bytes


def assert_batch_within_mode(batch: Batch, c: Contract) -> None:
    items = batch.items
    assert items and len(items) <= c.max_items
    assert {(it.model, it.shape, it.lane) for it in items} == {(batch.model, batch.shape, batch.lane)}
    longest = max(it.length for it in items)
    assert batch.padded_length == round_up(longest, c.pad_multiple)
    outputs = sum(counted_output(it, c) for it in items)
    fits = within_mode(c, len(items), batch.padded_length, outputs)
    if batch.oversized:
        assert len(items) == 1 and not fits, batch
    else:
        assert fits, batch


def batch_of(items: list[Item], c: Contract, **changes: Any) -> Batch:
    for it in items:
        it.lane = 0
    fields: dict[str, Any] = {
        "batch_id": "b",
        "consumer": c.consumer,
        "model": MODEL,
        "shape": SHAPE_A,
        "lane": 0,
        "pad_multiple": c.pad_multiple,
        "padded_length": round_up(max(it.length for it in items), c.pad_multiple),
        "items": items,
        "created_ms": 0,
    }
    return Batch(**{**fields, **changes})


# ------------------------------------------------------------------------------ the contract's rule


def test_an_old_style_contract_is_tokens_batching_with_the_old_arithmetic() -> None:
    c = Contract("c", MODEL, 1000, 4)
    assert (c.batching, c.memory_bytes, c.kv_bytes_per_token, c.default_output_tokens) == ("tokens", 0, 0, 0)
    assert c == Contract("c", MODEL, 1000, 4, batching="tokens")
    assert c.fits(4, 248) and not c.fits(4, 249)  # 249 pads to 256: 4 x 256 > 1000
    assert c.fits(1, 1000) and not c.fits(1, 1001)
    assert not c.fits(5, 8)  # max_items
    assert c.fits(2, 100, output_tokens=10**9)  # outputs do not count in tokens batching


def test_rows_batching_counts_items_only() -> None:
    c = contract("rows", budget_tokens=8, max_items=3)
    assert c.fits(3, 10**6) and not c.fits(4, 1)
    assert not c.is_oversized(10**9)


def test_memory_batching_counts_padded_prompts_plus_outputs_in_kv_bytes() -> None:
    c = contract("memory", memory_bytes=1_000 * KV, pad_multiple=8, default_output_tokens=50)
    assert c.fits(4, 200, 200)  # (4 x 200 + 200) x KV = 1,000 KV
    assert not c.fits(4, 200, 201)
    assert c.fits(4, 201, 168) and not c.fits(4, 201, 169)  # 201 pads to 208: 4 x 208 + 168 = 1,000
    assert c.rule.output_tokens(None) == 50
    assert c.rule.output_tokens(-7) == 0  # a negative output budget buys no room
    # Alone, with no output budget of its own, an item counts the default 50: 944 + 50 fits, 952 + 50 not.
    assert not c.is_oversized(944) and c.is_oversized(945)
    assert not c.is_oversized(8, output_budget=992) and c.is_oversized(8, output_budget=993)


@given(
    st.sampled_from(BATCHING_MODES),
    st.integers(1, 40),
    st.sampled_from([1, 8, 64]),
    st.integers(1, 3000),
    st.integers(0, 500),
    st.integers(1, 200_000),
)
def test_capacity_is_the_most_items_that_fit(
    mode: str, max_items: int, pad: int, longest: int, output_each: int, limit: int
) -> None:
    c = contract(mode, max_items=max_items, pad_multiple=pad, budget_tokens=limit, memory_bytes=limit * 10)
    cap = c.rule.capacity(longest, output_each)
    padded = round_up(longest, pad)
    assert 0 <= cap <= max_items
    for n in range(1, max_items + 2):
        assert within_mode(c, n, padded, n * output_each) == (n <= cap)
        assert c.fits(n, longest, n * output_each) == within_mode(c, n, padded, n * output_each)
    assert c.is_oversized(longest, output_each) == (cap == 0)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"batching": "pages"}, "batching must be one of rows, tokens, memory, got 'pages'"),
        ({"batching": "memory"}, "memory_bytes must be >= 1 in memory batching, got 0"),
        ({"batching": "memory", "memory_bytes": 10}, "kv_bytes_per_token must be >= 1 in memory batching"),
        ({"memory_bytes": -1}, "memory_bytes must be an integer >= 0, got -1"),
        ({"default_output_tokens": -5}, "default_output_tokens must be an integer >= 0, got -5"),
        ({"kv_bytes_per_token": 1.5}, "kv_bytes_per_token must be an integer >= 0, got 1.5"),
        ({"max_items": 0}, "max_items must be a positive integer, got 0"),
    ],
)
def test_bad_batching_fields_are_refused_in_one_line_naming_the_field(
    fields: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ValueError) as info:
        Contract("gpu-0", MODEL, **{"budget_tokens": 4096, "max_items": 8, **fields})
    message = str(info.value)
    assert message.startswith("contract gpu-0: ") and needle in message and "\n" not in message


# ------------------------------------------------------------------------------ scheduler, per mode


def test_rows_batching_ignores_the_token_budget() -> None:
    c = contract("rows", budget_tokens=64, max_items=4)
    sched = make_scheduler(c)
    submit_all(sched, [item(1000) for _ in range(10)])
    batches = drain(sched)
    assert [len(b.items) for b in batches] == [4, 4, 2]
    assert all(b.padded_tokens == len(b.items) * 1000 > c.budget_tokens for b in batches)
    assert not any(b.oversized for b in batches) and sched.oversized == 0


def test_memory_batching_puts_an_item_with_a_big_output_budget_in_a_smaller_batch() -> None:
    # (n x 104 + outputs) x KV <= 1,000 KV. Items of 100 tokens pad to 104; most ask for 10 outputs.
    c = contract("memory", memory_bytes=1_000 * KV, max_items=64)
    small = [item(100, 10) for _ in range(4)]
    big = item(100, 600)
    rest = [item(100, 10) for _ in range(4)]
    sched = make_scheduler(c)
    submit_all(sched, [*small, big, *rest])
    batches = drain(sched)
    assert [len(b.items) for b in batches] == [4, 3, 2]
    holding_big = next(b for b in batches if big in b.items)
    assert len(holding_big.items) < len(batches[0].items)
    for b in batches:
        assert_batch_within_mode(b, c)
    # The same nine items under tokens batching with the same token room: one batch of nine.
    tokens = contract("tokens", budget_tokens=1_000, max_items=64)
    sched = make_scheduler(tokens)
    submit_all(
        sched, [item(100, 10) for _ in range(4)] + [item(100, 600)] + [item(100, 10) for _ in range(4)]
    )
    assert [len(b.items) for b in drain(sched)] == [9]


def test_memory_batching_counts_the_default_output_for_items_without_a_budget() -> None:
    c = contract("memory", memory_bytes=1_000 * KV, default_output_tokens=146)
    sched = make_scheduler(c)
    submit_all(sched, [item(100) for _ in range(8)])  # 4 x (104 + 146) = 1,000: four per batch
    assert [len(b.items) for b in drain(sched)] == [4, 4]


@pytest.mark.parametrize(
    ("mode", "fields", "length", "output"),
    [
        ("tokens", {"budget_tokens": 1000}, 5000, None),
        ("memory", {"memory_bytes": 1000 * KV}, 5000, None),
        ("memory", {"memory_bytes": 1000 * KV}, 100, 5000),  # a short prompt with a long generation
    ],
    ids=["tokens", "memory-prompt", "memory-output"],
)
def test_an_oversized_item_goes_out_alone_in_each_bounded_mode(
    mode: str, fields: dict[str, Any], length: int, output: int | None
) -> None:
    c = contract(mode, **fields)
    sched = make_scheduler(c)
    huge = item(length, output)
    before = [item(100, 0) for _ in range(2)]
    after = [item(100, 0) for _ in range(2)]
    submit_all(sched, [*before, huge, *after])
    batches = drain(sched)
    alone = [b for b in batches if huge in b.items]
    assert len(alone) == 1 and alone[0].items == [huge] and alone[0].oversized
    assert sched.oversized == 1
    for b in batches:
        assert_batch_within_mode(b, c)


def test_rows_batching_has_no_oversized_items_a_huge_one_shares_its_batch() -> None:
    c = contract("rows", budget_tokens=1000, max_items=8)
    one_lane = {"floor_tokens": 10**6, "cap_tokens": 10**6}
    sched = make_scheduler(c, lanes=LaneSettings(**one_lane, cut="arrival"))  # type: ignore[arg-type]
    huge = item(100_000)
    submit_all(sched, [item(100), huge, item(100)])
    (batch,) = drain(sched)
    assert huge in batch.items and len(batch.items) == 3 and not batch.oversized
    # cut by length, the two short ones do not pad to the huge one: it goes alone, still not oversized
    sched = make_scheduler(c, lanes=LaneSettings(**one_lane))  # type: ignore[arg-type]
    huge = item(100_000)
    submit_all(sched, [item(100), huge, item(100)])
    alone, pair = drain(sched)
    assert alone.items == [huge] and not alone.oversized and len(pair.items) == 2


def test_a_small_memory_card_leaves_an_item_to_the_peer_whose_memory_holds_it() -> None:
    small = contract("memory", "small", memory_bytes=1_000 * KV)
    big = contract("memory", "big", memory_bytes=10_000 * KV)
    sched = make_scheduler(small, big)
    # Fits small by its prompt (104 tokens) but not with its output: only big may take it.
    long_output = item(100, 2_000)
    submit_all(sched, [long_output])
    assert sched.next_batch("small", 0) is None
    batch = sched.next_batch("big", 0)
    assert batch is not None and batch.items == [long_output] and not batch.oversized


def test_a_rows_peer_holds_everything_so_a_tokens_card_gets_only_what_fits_it() -> None:
    tokens = contract("tokens", "tokens-card", budget_tokens=1000)
    rows = contract("rows", "rows-card", max_items=8)
    sched = make_scheduler(tokens, rows)
    long = item(5000)
    submit_all(sched, [long])
    assert sched.next_batch("tokens-card", 0) is None
    batch = sched.next_batch("rows-card", 0)
    assert batch is not None and batch.items == [long] and not batch.oversized


modes = st.sampled_from(BATCHING_MODES)
outputs = st.one_of(st.none(), st.integers(-5, 3000))
items_st = st.lists(
    st.tuples(
        st.one_of(st.integers(1, 600), st.integers(1, 20_000)), outputs, st.sampled_from([SHAPE_A, SHAPE_B])
    ),
    min_size=1,
    max_size=80,
)


@st.composite
def mode_contracts(draw: st.DrawFn) -> list[Contract]:
    return [
        contract(
            draw(modes),
            f"c{i}",
            budget_tokens=draw(st.integers(64, 40_000)),
            max_items=draw(st.integers(1, 24)),
            pad_multiple=draw(st.sampled_from([1, 8, 64])),
            max_inflight=draw(st.integers(1, 3)),
            memory_bytes=draw(st.integers(1, 60_000)) * KV,
            kv_bytes_per_token=KV,
            default_output_tokens=draw(st.integers(0, 2000)),
        )
        for i in range(draw(st.integers(1, 3)))
    ]


@settings(max_examples=150, deadline=None)
@given(mode_contracts(), items_st)
def test_every_batch_the_scheduler_emits_satisfies_its_consumers_mode(
    contracts: list[Contract], specs: list[tuple[int, int | None, int]]
) -> None:
    sched = make_scheduler(*contracts)
    items = [item(length, out, shape=shape) for length, out, shape in specs]
    submit_all(sched, items)
    batches = drain(sched)
    by_name = {c.consumer: c for c in contracts}
    for b in batches:
        assert_batch_within_mode(b, by_name[b.consumer])
    sent = Counter(it.id for b in batches for it in b.items)
    assert sent == Counter(it.id for it in items)
    sched.check()


@pytest.mark.parametrize("cut", ["arrival", "length"])
@settings(max_examples=150, deadline=None)
@given(mode_contracts(), items_st)
def test_take_cuts_the_longest_prefix_that_fits(
    cut: str, contracts: list[Contract], specs: list[tuple[int, int | None, int]]
) -> None:
    """In arrival order, or longest first (ties in arrival order) with no padding limit: the batch is
    the longest prefix of that order within the mode, as the baselines cut it."""
    c = contracts[0]
    # every item in one lane; no cut_tokens limit, so that only the mode cuts the batch
    one_lane = LaneSettings(floor_tokens=10**6, cap_tokens=10**6, cut=cut, cut_tokens=10**6, cut_ratio=10.0)
    table = LaneTable(one_lane)
    for length, out, _shape in specs:
        sl = table.place(item(length, out), 0)
    while table.waiting_items:
        lane = next(iter(sl.ready.values()))
        order = lane.in_cut_order()
        if cut == "length":
            assert order == sorted(order, key=lambda it: it.length, reverse=True)
        expected_n = 0
        for n in range(1, len(order) + 1):
            head = order[:n]
            padded = round_up(max(it.length for it in head), c.pad_multiple)
            if not within_mode(c, n, padded, sum(counted_output(it, c) for it in head)):
                break
            expected_n = n
        taken, padded_length = table.take_batch(sl, lane, c.rule, 0)
        assert taken == order[: max(expected_n, 1)]
        assert padded_length == round_up(max(it.length for it in taken), c.pad_multiple)
        assert len(taken) == pack_prefix(order, c)  # the baselines cut the same


# ------------------------------------------------------------------------------ checks at both ends


def test_check_batch_refuses_a_batch_over_its_memory() -> None:
    c = contract("memory", memory_bytes=1_000 * KV)
    over = [item(100, 300), item(100, 300)]  # (2 x 104 + 600) x KV = 808 KV: fits
    check_batch(batch_of(over, c), c)
    over.append(item(100, 300))  # (3 x 104 + 900) x KV = 1,212 KV
    with pytest.raises(InvariantViolation, match="1212000 KV bytes > memory_bytes 1000000"):
        check_batch(batch_of(over, c), c)
    check_batch(batch_of([item(100, 5000)], c, oversized=True), c)  # alone, it may exceed


def test_check_batch_in_rows_mode_ignores_the_token_budget_but_not_max_items() -> None:
    c = contract("rows", budget_tokens=8, max_items=2)
    check_batch(batch_of([item(1000), item(1000)], c), c)
    with pytest.raises(InvariantViolation, match="3 items > max_items 2"):
        check_batch(batch_of([item(1000) for _ in range(3)], c), c)


def record(item_id: str, length: int, output: int | None = None) -> TokenItemRecord:
    return TokenItemRecord(
        item_id=item_id,
        model=MODEL,
        shape=SHAPE_A,
        token_count=length,
        tokens=tokens_from_ids([1] * length),
        produced_ms=0,
        output_budget=output,
    )


def batch_record(records: list[TokenItemRecord], padded_length: int, consumer: str = "c") -> BatchRecord:
    return BatchRecord(
        batch_id="b",
        consumer=consumer,
        model=MODEL,
        shape=SHAPE_A,
        lane=0,
        padded_length=padded_length,
        pad_multiple=8,
        created_ms=0,
        items=records,
    )


def test_the_consumer_app_rejects_a_batch_over_its_memory_and_accepts_one_within() -> None:
    c = contract("memory", memory_bytes=1_000 * KV, default_output_tokens=500)
    within = batch_record([record("a", 100, 300), record("b", 100, 300)], 104)
    assert contract_violation(c, within) is None  # (2 x 104 + 600) x KV = 808 KV
    # No output budget: the contract's default (500) counts, so (2 x 104 + 800) x KV > 1,000 KV.
    over = batch_record([record("a", 100, 300), record("b", 100)], 104)
    assert contract_violation(c, over) == (
        "(2 items x padded_length 104 + 800 output tokens) x 1000 bytes per token = 1008000 bytes > "
        "contract memory_bytes 1000000"
    )
    alone = batch_record([record("a", 100, 50_000)], 104)
    assert contract_violation(c, alone) is None  # a single oversized item travels alone


def test_the_consumer_app_in_rows_mode_checks_items_not_tokens() -> None:
    c = contract("rows", budget_tokens=8, max_items=2)
    assert contract_violation(c, batch_record([record("a", 500), record("b", 500)], 504)) is None
    three = batch_record([record(x, 5) for x in "abc"], 8)
    assert "3 items > contract max_items 2" in str(contract_violation(c, three))


def test_the_consumer_app_in_tokens_mode_keeps_its_message() -> None:
    c = contract("tokens", budget_tokens=256)
    big = batch_record([record("a", 200), record("b", 10)], 200)
    assert contract_violation(c, big) == "2 items x padded_length 200 = 400 tokens > contract budget 256"


@given(
    st.sampled_from(BATCHING_MODES),
    st.integers(1, 40),
    st.sampled_from([1, 8, 64]),
    st.integers(1, 3000),
    st.one_of(st.none(), st.integers(-5, 500)),
    st.integers(1, 200_000),
)
def test_fits_alone_is_fits_for_one_item(
    mode: str, max_items: int, pad: int, length: int, output_budget: int | None, limit: int
) -> None:
    """The shortcut dispatch asks of every lane (``longest_alone`` in rows and tokens mode) says what
    the rule says of a batch of one."""
    c = contract(mode, max_items=max_items, pad_multiple=pad, budget_tokens=limit, memory_bytes=limit * 10)
    rule = c.rule
    assert rule.fits_alone(length, output_budget) == rule.fits(1, length, rule.output_tokens(output_budget))
    assert (rule.longest_alone >= 0) == (mode != "memory")
