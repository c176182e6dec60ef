"""Lane assignment: which lane of its shape a new item joins, when lanes open, grow and go quiet."""

from __future__ import annotations

from collections import deque

import pytest

from processor.core.contract import BatchRule
from processor.core.item import Item
from processor.core.lane import ByLength
from processor.core.lanes import LaneSettings, LaneTable, ShapeLanes
from tests.core.helpers import MODEL, SHAPE_A, SHAPE_B, lane_of, make_item, reps

# The placement tests run on the first generation's narrow lanes, cut in arrival order; the defaults
# (one lane per shape, cut by length) are tested at the end.
FIRST_GENERATION: dict[str, object] = {"floor_tokens": 0, "cap_tokens": 256, "cut": "arrival"}


def table(**settings: object) -> LaneTable:
    return LaneTable(LaneSettings(**{**FIRST_GENERATION, **settings}))  # type: ignore[arg-type]


def place(t: LaneTable, length: int, now_ms: int = 0, shape: int = SHAPE_A) -> Item:
    item = make_item(length, shape=shape, t=now_ms)
    t.place(item, now_ms)
    return item


def empty_lane(t: LaneTable, item: Item, now_ms: int) -> None:
    """Take everything from ``item``'s lane (as a dispatch would), leaving it empty from ``now_ms``."""
    sl = t.shapes[(item.model, item.shape)]
    lane = sl.lanes[item.lane]
    while lane.items:
        t.take(sl, lane, budget_tokens=10**9, max_items=10**6, pad_multiple=8, now_ms=now_ms)


def shape_lanes(t: LaneTable, shape: int = SHAPE_A) -> ShapeLanes:
    return t.shapes[(MODEL, shape)]


# ------------------------------------------------------------------------------ choosing a neighbour


class TestNeighbourChoice:
    # A floor of 200 tokens makes every join below it unconditional, so only "which neighbour" is tested.
    settings = {"pad_multiple": 100, "floor_tokens": 200, "cap_tokens": 300}

    def two_lanes(self) -> tuple[LaneTable, Item, Item]:
        t = table(**self.settings)
        low = place(t, 1000)
        high = place(t, 1300)  # 300 tokens of padding > floor: a second lane
        assert low.lane != high.lane
        return t, low, high

    def test_item_nearer_the_upper_lane_joins_it_and_is_padded_up(self) -> None:
        t, _low, high = self.two_lanes()
        item = place(t, 1250)
        assert item.lane == high.lane
        assert reps(t) == {0: 1000, 1: 1300}

    def test_item_nearer_the_lower_lane_joins_it_and_the_lane_grows(self) -> None:
        t, low, _high = self.two_lanes()
        item = place(t, 1050)
        assert item.lane == low.lane
        assert reps(t) == {0: 1050, 1: 1300}

    def test_distance_is_measured_after_rounding_to_pad_multiple(self) -> None:
        # Raw lengths say 1101 is nearer 1000 (101 vs 199); padded to 1200 it is nearer 1300 (200 vs 100).
        t, _low, high = self.two_lanes()
        item = place(t, 1101)
        assert item.lane == high.lane

    def test_item_above_every_lane_joins_the_top_one_and_raises_it(self) -> None:
        t, _low, high = self.two_lanes()
        item = place(t, 1450)  # pads to 1500: 200 above the top lane, within the floor
        assert item.lane == high.lane
        assert reps(t)[high.lane] == 1450

    def test_item_below_every_lane_joins_the_bottom_one_without_changing_it(self) -> None:
        t, low, _high = self.two_lanes()
        item = place(t, 850)  # pads to 900: 100 below the bottom lane
        assert item.lane == low.lane
        assert reps(t)[low.lane] == 1000

    def test_shapes_and_models_never_share_lanes(self) -> None:
        t = table()
        a = place(t, 1000, shape=SHAPE_A)
        b = place(t, 1000, shape=SHAPE_B)
        other_model = Item("x", "other-model", SHAPE_A, 1000, 0)
        t.place(other_model, 0)
        assert len(t.shapes) == 3
        assert a.lane == b.lane == other_model.lane == 0  # lane ids are per (model, shape)


# ------------------------------------------------------------------------------ floor, threshold, cap


def test_padding_at_or_below_floor_always_joins() -> None:
    t = table(floor_tokens=64, start_ratio=0.0, full_ratio=0.0)
    first = place(t, 1000)
    assert place(t, 1064).lane == first.lane  # 64 tokens of padding == floor
    other = table(floor_tokens=64, start_ratio=0.0, full_ratio=0.0)
    place(other, 1000)
    assert place(other, 1072).lane != 0  # 72 > floor: a new lane


def test_same_padded_length_always_shares_a_lane_with_the_default_floor() -> None:
    t = table()  # floor 0, pad 8
    first = place(t, 1001)
    for length in range(1001, 1009):  # all pad to 1008
        assert place(t, length).lane == first.lane
    assert len(shape_lanes(t).lanes) == 1


def test_padding_above_threshold_opens_a_lane_while_room_exists() -> None:
    t = table()
    s = t.settings
    place(t, 10_000)
    assert 16 < s.threshold_tokens(10_016, lanes_in_use=1) < 64
    assert place(t, 10_016).lane == 0  # 16 tokens of padding: below the threshold, joins
    assert place(t, 10_080).lane == 1  # 64 above the lane (now 10,016): over the threshold, opens
    assert t.stats.new_lanes == 2 and t.stats.reuses == 1


def test_threshold_starts_at_start_ratio_and_reaches_full_ratio() -> None:
    s = LaneSettings(lane_budget=100, floor_tokens=0, start_ratio=0.01, full_ratio=0.05, cap_tokens=10_000)
    assert s.threshold_tokens(10_000, 0) == pytest.approx(100)
    assert s.threshold_tokens(10_000, 50) == pytest.approx(300)
    assert s.threshold_tokens(10_000, 100) == pytest.approx(500)
    rising = [s.threshold_tokens(10_000, n) for n in range(101)]
    assert rising == sorted(rising)


def test_threshold_is_clamped_between_floor_and_cap() -> None:
    s = LaneSettings(floor_tokens=32, cap_tokens=256)
    assert s.threshold_tokens(100, 0) == 32  # 100 x 0.002 is below the floor
    assert s.threshold_tokens(1_000_000, 2048) == 256  # 5% of a million is above the cap


def test_the_same_padding_opens_a_lane_early_and_joins_once_the_budget_fills() -> None:
    # threshold = length x 0.1 x lanes/4 (pad 1, no floor, no effective cap)
    t = table(lane_budget=4, pad_multiple=1, start_ratio=0.0, full_ratio=0.1, cap_tokens=10_000)
    place(t, 1000)
    opened = place(t, 1040)  # 40 > threshold(1040, 1 lane) = 26
    assert opened.lane == 1
    joined = place(t, 1080)  # 40 < threshold(1080, 2 lanes) = 54
    assert joined.lane == 1
    assert len(shape_lanes(t).lanes) == 2


def test_padding_above_cap_opens_a_lane_even_when_the_ratio_would_allow_it() -> None:
    t = table(cap_tokens=64, start_ratio=1.0, full_ratio=1.0)  # the ratio alone would accept anything
    place(t, 1000)
    assert place(t, 1064).lane == 0  # 64 == cap: accepted
    assert place(t, 1144).lane == 1  # 1144 - 1064 = 80 > cap: a new lane


def test_padding_above_cap_reclaims_an_idle_lane_rather_than_being_accepted() -> None:
    t = table(lane_budget=2, idle_ms=100)
    quiet = place(t, 1000, now_ms=0)
    empty_lane(t, quiet, now_ms=0)
    busy = place(t, 5000, now_ms=0)
    assert len(shape_lanes(t).lanes) == 2  # the budget is full, lane 0 is empty since t=0

    item = place(t, 3000, now_ms=200)  # 2000 tokens from either lane, far above the cap
    assert item.lane == quiet.lane == 0  # the quiet lane's id, reused
    assert reps(t) == {0: 3000, 1: 5000}
    assert busy.lane == 1
    assert (t.stats.idle_reclaims, t.stats.id_reuses) == (1, 1)
    t.check()


def test_reclaiming_the_shapes_only_lane_to_place_an_item_keeps_the_shape() -> None:
    # lane_budget 1: the only lane is empty and idle, the new item is far from it. Reclaiming that lane
    # empties the shape; the item must still land in a shape the table knows about.
    t = table(lane_budget=1, idle_ms=100)
    first = place(t, 1000, now_ms=0)
    empty_lane(t, first, now_ms=0)
    item = place(t, 5000, now_ms=200)
    assert (MODEL, SHAPE_A) in t.shapes
    assert list(t.waiting()) == [item]
    assert reps(t) == {0: 5000}
    t.check()


def test_full_budget_with_nothing_reclaimable_joins_the_best_lane_anyway() -> None:
    t = table(lane_budget=2, idle_ms=100)
    low = place(t, 1000)
    high = place(t, 5000)
    nearer_high = place(t, 3200, now_ms=10_000)  # lanes hold items: nothing is reclaimable
    nearer_low = place(t, 2000, now_ms=10_000)
    assert nearer_high.lane == high.lane
    assert nearer_low.lane == low.lane
    assert reps(t) == {low.lane: 2000, high.lane: 5000}
    assert len(shape_lanes(t).lanes) == 2


# ------------------------------------------------------------------------------ growth, no merging


def test_a_lane_representative_never_decreases() -> None:
    t = table(floor_tokens=4096, cap_tokens=4096)  # everything joins the one lane
    seen = []
    for length in (100, 50, 3000, 10, 2999, 4000, 1):
        place(t, length)
        seen.append(reps(t)[0])
    assert seen == [100, 100, 3000, 3000, 3000, 4000, 4000]
    sl = shape_lanes(t)
    t.take(sl, sl.lanes[0], budget_tokens=10**9, max_items=100, pad_multiple=8, now_ms=0)
    assert reps(t)[0] == 4000  # emptying a lane does not shrink it either


def test_neighbouring_lanes_are_never_merged() -> None:
    t = table()
    a = place(t, 1000)
    b = place(t, 1008)  # 8 tokens apart, over the (tiny) threshold: its own lane
    assert a.lane != b.lane
    for _ in range(50):
        assert place(t, 1000).lane == a.lane
        assert place(t, 1008).lane == b.lane
        assert place(t, 1004).lane == b.lane  # pads to 1008: no padding in b's lane
    assert reps(t) == {a.lane: 1000, b.lane: 1008}


def test_a_lane_creeping_up_towards_its_neighbour_never_overtakes_or_merges_with_it() -> None:
    t = table(lane_budget=2)
    low = place(t, 1000)
    high = place(t, 2000)
    for length in range(1000, 2001, 8):  # ascending: each item is just above the lower lane
        place(t, length)
    r = reps(t)
    assert low.lane != high.lane and len(r) == 2
    assert r[low.lane] < r[high.lane] == 2000


# ------------------------------------------------------------------------------ quiet lanes and ids


def test_an_empty_lane_goes_quiet_after_idle_ms() -> None:
    t = table(idle_ms=3000)
    item = place(t, 1000, now_ms=0)
    empty_lane(t, item, now_ms=500)
    assert t.reclaim_idle(3499) == 0
    assert t.stats.lanes_in_use == 1
    assert t.reclaim_idle(3500) == 1
    assert t.stats.lanes_in_use == 0 and t.stats.idle_reclaims == 1
    assert (MODEL, SHAPE_A) not in t.shapes  # a shape with no lanes left is forgotten
    t.check()


def test_quiet_lane_ids_are_reused_lowest_first() -> None:
    t = table(idle_ms=10)
    items = [place(t, n) for n in (1000, 2000, 3000, 4000)]
    assert [it.lane for it in items] == [0, 1, 2, 3]
    for it in (items[2], items[0], items[1]):  # empty 2, then 0, then 1; lane 3 keeps its item
        empty_lane(t, it, now_ms=0)
    assert t.reclaim_idle(10) == 3
    assert reps(t) == {3: 4000}
    new = [place(t, n, now_ms=20) for n in (500, 9000, 7000, 6000)]
    assert [it.lane for it in new] == [0, 1, 2, 4]  # free ids lowest first, then a fresh one
    assert t.stats.id_reuses == 3
    assert max(reps(t)) < t.settings.lane_budget


def test_a_lane_holding_items_is_never_reclaimed() -> None:
    t = table(idle_ms=0)
    item = place(t, 1000, now_ms=0)
    assert t.reclaim_idle(10**12) == 0
    assert list(t.waiting()) == [item]


def test_a_lane_that_refills_before_idle_ms_is_not_reclaimed() -> None:
    t = table(idle_ms=100)
    first = place(t, 1000, now_ms=0)
    empty_lane(t, first, now_ms=0)
    again = place(t, 1000, now_ms=50)
    assert again.lane == first.lane
    assert t.reclaim_idle(10_000) == 0
    empty_lane(t, again, now_ms=10_000)
    assert t.reclaim_idle(10_099) == 0  # idle since 10,000, not since 0
    assert t.reclaim_idle(10_100) == 1


def test_take_respects_budget_and_max_items_and_keeps_arrival_order() -> None:
    t = table(floor_tokens=1000, cap_tokens=1000)
    items = [place(t, n) for n in (100, 300, 200, 500, 100)]
    sl = shape_lanes(t)
    taken, padded = t.take(sl, sl.lanes[0], budget_tokens=1200, max_items=10, pad_multiple=8, now_ms=0)
    assert taken == items[:3] and padded == 304  # a 4th would make 4 x 504 > 1200
    taken, padded = t.take(sl, sl.lanes[0], budget_tokens=10**6, max_items=1, pad_multiple=8, now_ms=0)
    assert taken == items[3:4] and padded == 504
    assert all(it.dispatched for it in items[:4]) and not items[4].dispatched
    t.check()


def test_take_sends_an_item_larger_than_the_budget_alone() -> None:
    t = table()
    big = place(t, 9000)
    place(t, 9000)
    sl = shape_lanes(t)
    taken, padded = t.take(sl, sl.lanes[0], budget_tokens=4096, max_items=64, pad_multiple=8, now_ms=0)
    assert taken == [big] and padded == 9000
    assert t.waiting_items == 1


# ------------------------------------------------------------------------------ self-check


def test_check_passes_on_a_busy_table() -> None:
    t = table(lane_budget=4)
    for n in range(1, 5000, 37):
        place(t, n, shape=SHAPE_A if n % 2 else SHAPE_B)
    t.check()
    assert t.waiting_items == len(list(t.waiting()))


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda t, sl, lane: setattr(lane, "tokens", lane.tokens + 1), "holds 1000 tokens, counted 1001"),
        (lambda t, sl, lane: setattr(sl, "waiting_items", sl.waiting_items + 1), "counted 2 / 1000"),
        (lambda t, sl, lane: setattr(t, "waiting_tokens", t.waiting_tokens - 5), "counted 1 / 995"),
        (lambda t, sl, lane: setattr(lane, "rep", 10), "longer than rep 10"),
        (lambda t, sl, lane: setattr(t.stats, "lanes_in_use", 7), "1 lanes exist, counted 7"),
    ],
    ids=["lane tokens", "shape items", "table tokens", "lane rep", "lane count"],
)
def test_check_catches_a_tampered_counter(tamper, message: str) -> None:  # type: ignore[no-untyped-def]
    t = table()
    place(t, 1000)
    sl = shape_lanes(t)
    tamper(t, sl, sl.lanes[0])
    with pytest.raises(AssertionError, match=message):
        t.check()


@pytest.mark.parametrize(
    "bad",
    [
        {"lane_budget": 0},
        {"pad_multiple": 0},
        {"floor_tokens": 300, "cap_tokens": 256},
        {"floor_tokens": -1},
        {"start_ratio": 0.1, "full_ratio": 0.05},
        {"start_ratio": -0.1},
        {"idle_ms": -1},
    ],
)
def test_settings_reject_inconsistent_knobs(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LaneSettings(**bad)  # type: ignore[arg-type]


def test_lane_pressure_is_lanes_in_use_over_shapes_times_budget() -> None:
    t = table(lane_budget=4)
    assert t.lane_pressure() == 0.0
    place(t, 1000)
    place(t, 5000)
    place(t, 1000, shape=SHAPE_B)
    assert t.lane_pressure() == pytest.approx(3 / 8)
    _sl, rep = lane_of(t, place(t, 4999))
    assert rep == 5000


# ------------------------------------------------------------------------------ cut by length (defaults)


def length_table(**settings: object) -> LaneTable:
    return LaneTable(LaneSettings(**settings))  # type: ignore[arg-type]


def test_the_defaults_keep_one_lane_per_shape_cut_by_length() -> None:
    t = length_table()
    assert t.settings.cut == "length" and t.by_length
    items = [place(t, n) for n in (100, 9000, 3000, 40, 9000)] + [place(t, 500, shape=SHAPE_B)]
    assert {it.lane for it in items} == {0} and len(shape_lanes(t).lanes) == 1
    assert len(shape_lanes(t, SHAPE_B).lanes) == 1
    t.check()


def test_a_batch_takes_the_longest_items_first_ties_in_arrival_order() -> None:
    t = length_table(cut_ratio=1.0, cut_tokens=10**6)
    items = [place(t, n) for n in (100, 300, 200, 300, 500, 100)]
    sl = shape_lanes(t)
    taken, padded = t.take(sl, sl.lanes[0], budget_tokens=1600, max_items=10, pad_multiple=8, now_ms=0)
    assert taken == [items[4], items[1], items[3]] and padded == 504  # a 4th: 4 x 504 > 1600
    taken, padded = t.take(sl, sl.lanes[0], budget_tokens=10**6, max_items=10, pad_multiple=8, now_ms=0)
    assert taken == [items[2], items[0], items[5]] and padded == 200
    t.check()


def test_the_cut_stops_where_an_item_would_pad_by_more_than_cut_tokens_or_cut_ratio() -> None:
    t = length_table(cut_tokens=64, cut_ratio=0.02)
    lengths = (10_000, 9_950, 9_900, 1_000, 995, 970)
    items = [place(t, n) for n in lengths]
    sl = shape_lanes(t)
    cuts = []
    while sl.waiting_items:
        taken, _ = t.take(sl, sl.lanes[0], budget_tokens=10**6, max_items=100, pad_multiple=8, now_ms=0)
        cuts.append([it.length for it in taken])
    # padded to 8: 9,904 pads by 96 > 64 tokens; 976 pads by 24 > 2% of 1,000 (995 -> 1,000 by 0)
    assert cuts == [[10_000, 9_950], [9_900], [1_000, 995], [970]]
    assert sorted(it.id for it in items) == sorted(it.id for it in items if it.dispatched)


def test_a_lane_cut_by_length_stays_sorted_as_items_arrive() -> None:
    t = length_table()
    a, b, c, d = (place(t, n) for n in (100, 50, 700, 100))
    lane = shape_lanes(t).lanes[0]
    assert lane.head() is c and lane.shortest() is b
    assert lane.in_cut_order() == [c, a, d, b]  # longest first, equal lengths oldest first
    t.check()


def test_an_anchor_goes_first_and_the_batch_takes_only_items_no_longer_than_it() -> None:
    t = length_table(cut_ratio=1.0, cut_tokens=10**6)
    items = [place(t, n) for n in (900, 500, 800, 400, 300)]
    sl = shape_lanes(t)
    rule = BatchRule(max_items=3, pad_multiple=8, batching="tokens", budget_tokens=10**6)
    taken, padded = t.take_batch(sl, sl.lanes[0], rule, 0, anchor=items[1])
    assert taken == [items[1], items[3], items[4]] and padded == 504
    assert [it.length for it in sl.lanes[0].in_cut_order()] == [900, 800]  # the longer ones stay
    t.check()


def test_leave_longer_starts_the_batch_at_the_longest_item_that_fits_alone() -> None:
    t = length_table(cut_ratio=1.0, cut_tokens=10**6)
    items = [place(t, n) for n in (5000, 900, 4000, 800)]
    sl = shape_lanes(t)
    rule = BatchRule(max_items=8, pad_multiple=8, batching="tokens", budget_tokens=2048)
    taken, padded = t.take_batch(sl, sl.lanes[0], rule, 0, leave_longer=True)
    assert taken == [items[1], items[3]] and padded == 904
    assert [it.length for it in sl.lanes[0].in_cut_order()] == [5000, 4000]
    t.check()


@pytest.mark.parametrize(
    ("lengths", "budget", "first"),
    [
        ((5000, 900, 4000, 800), 2048, 900),  # the longest that fits alone, below two that do not
        ((2048, 3000, 100), 2048, 2048),  # exactly the budget fits alone
        ((5000, 4000), 2048, 4000),  # none fits alone: the batch is the shortest, oversized
    ],
)
@pytest.mark.parametrize("batching", ["tokens", "memory"])
def test_leave_longer_finds_the_same_start_by_length_or_item_by_item(
    lengths: tuple[int, ...], budget: int, first: int, batching: str
) -> None:
    """Tokens mode finds where the batch starts by bisecting the lengths (``longest_alone``); memory
    mode, where outputs count, asks each length's oldest item in turn: both start at ``first``."""
    t = length_table(cut_ratio=1.0, cut_tokens=10**6)
    for n in lengths:
        place(t, n)
    sl = shape_lanes(t)
    if batching == "tokens":
        rule = BatchRule(max_items=8, pad_multiple=8, batching="tokens", budget_tokens=budget)
    else:  # one KV byte per token and no output: the memory limit is the tokens budget
        rule = BatchRule(
            max_items=8,
            pad_multiple=8,
            batching="memory",
            memory_bytes=budget,
            kv_bytes_per_token=1,
            default_output_tokens=0,
        )
    taken, _padded = t.take_batch(sl, sl.lanes[0], rule, 0, leave_longer=True)
    assert taken[0].length == first
    t.check()


def test_check_catches_a_lane_cut_by_length_that_is_out_of_order() -> None:
    t = length_table()
    place(t, 100)
    place(t, 50)
    lane = shape_lanes(t).lanes[0]
    lane.items.lengths.reverse()  # type: ignore[union-attr]  # longest first: not how it keeps them
    with pytest.raises(AssertionError, match="not sorted by length"):
        t.check()


def test_a_length_holding_many_items_moves_to_a_deque_and_stays_oldest_first() -> None:
    t = length_table()
    same = [place(t, 500) for _ in range(40)]
    place(t, 300)
    lane = shape_lanes(t).lanes[0]
    assert isinstance(lane.items, ByLength)
    assert type(lane.items.buckets[500]) is deque and type(lane.items.buckets[300]) is list
    sl = shape_lanes(t)
    taken, _ = t.take(sl, lane, budget_tokens=10 * 504, max_items=64, pad_multiple=8, now_ms=0)
    assert taken == same[:10]
    taken, _ = t.take(sl, lane, budget_tokens=10**6, max_items=64, pad_multiple=8, now_ms=0)
    assert taken == same[10:]  # 300 pads by 200 > cut_tokens: not in this batch
    t.check()
