"""The simulator: policies replayed in virtual time on synthetic and shipped traces."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest

from processor.core.contract import round_up
from processor.sim.report import SimReport, render_table
from processor.sim.simulator import DEFAULT_CONSUMERS, POLICIES, ConsumerSpec, parse_consumer_spec, simulate
from processor.sim.tracegen import synthetic_records
from processor.sim.traces import TraceRecord, read_shipped

CARDS = [parse_consumer_spec(s) for s in DEFAULT_CONSUMERS]


@pytest.fixture(scope="module")
def mixed() -> list[TraceRecord]:
    """1,500 requests over 6 shapes, arriving at 50/s for about 30 s."""
    return synthetic_records(1500, seed=7, shapes=6, min_len=16, max_len=12_000, rate_per_s=50)


def run(records: list[TraceRecord], policy: str = "lanes", **kwargs: object) -> SimReport:
    return simulate(records, CARDS, policy, **kwargs)  # type: ignore[arg-type]


def batch_lines(
    records: list[TraceRecord], policy: str = "lanes", **kwargs: object
) -> tuple[SimReport, list[dict]]:
    out = io.StringIO()
    report = run(records, policy, emit=out, **kwargs)
    return report, [json.loads(line) for line in out.getvalue().splitlines()]


# ------------------------------------------------------------------------------ determinism, balance


@pytest.mark.parametrize("policy", POLICIES)
def test_the_same_inputs_give_identical_figures(mixed: list[TraceRecord], policy: str) -> None:
    assert run(mixed, policy).to_dict() == run(mixed, policy).to_dict()


def test_the_seed_drives_engine_jitter_and_nothing_else(mixed: list[TraceRecord]) -> None:
    jittery = [parse_consumer_spec(s + ",jitter=0.3") for s in DEFAULT_CONSUMERS]
    a, b, c = (simulate(mixed, jittery, "lanes", seed=s).to_dict() for s in (1, 1, 2))
    assert a == b
    assert a["makespan_ms"] != c["makespan_ms"]
    assert (a["items"], a["tokens_completed"]) == (c["items"], c["tokens_completed"])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backlog", [False, True], ids=["timed", "backlog"])
def test_every_token_received_is_routed_and_completed(
    mixed: list[TraceRecord], policy: str, backlog: bool
) -> None:
    r = run(mixed, policy, backlog=backlog)
    assert r.items == len(mixed)
    assert r.tokens_received == r.tokens_routed == r.tokens_completed == sum(x.length for x in mixed)
    assert sum(f.items for f in r.consumers.values()) == len(mixed)
    assert r.padded_tokens >= r.tokens_routed


# ------------------------------------------------------------------------------ shapes and padding


def test_lanes_never_mix_shapes_and_fifo_does_when_shapes_mix(mixed: list[TraceRecord]) -> None:
    lanes, fifo = run(mixed, "lanes", backlog=True), run(mixed, "fifo", backlog=True)
    assert lanes.mixed_shape_batches == 0
    assert fifo.mixed_shape_batches > 0
    assert lanes.padding_waste < fifo.padding_waste


def test_with_a_single_shape_fifo_has_nothing_to_mix() -> None:
    one_shape = synthetic_records(300, seed=3, shapes=1, min_len=16, max_len=4000, rate_per_s=None)
    assert run(one_shape, "fifo").mixed_shape_batches == 0


def test_emitted_batch_lines_recompute_padding_waste_exactly(mixed: list[TraceRecord]) -> None:
    report, lines = batch_lines(mixed, backlog=True)
    assert len(lines) == report.batches
    padded = sum(b["padded_length"] * len(b["items"]) for b in lines)
    real = sum(length for b in lines for _, length in b["items"])
    assert (padded, real) == (report.padded_tokens, report.tokens_routed)
    assert (padded - real) / padded == report.padding_waste
    assert Counter(item_id for b in lines for item_id, _ in b["items"]) == Counter(r.id for r in mixed)


def test_every_emitted_lanes_batch_is_one_shape_one_lane_and_padded_to_its_longest(
    mixed: list[TraceRecord],
) -> None:
    shape_of = {r.id: r.shape for r in mixed}
    pad = {c.contract.consumer: c.contract.pad_multiple for c in CARDS}
    budget = {c.contract.consumer: c.contract.budget_tokens for c in CARDS}
    _report, lines = batch_lines(mixed)
    for b in lines:
        assert {shape_of[item_id] for item_id, _ in b["items"]} == {b["shape"]}
        assert b["lane"] >= 0
        longest = max(length for _, length in b["items"])
        assert b["padded_length"] == round_up(longest, pad[b["consumer"]])
        assert b["padded_length"] * len(b["items"]) <= budget[b["consumer"]] or len(b["items"]) == 1


# ------------------------------------------------------------------------------ time


def test_a_backlog_finishes_sooner_but_waits_longer_than_timed_arrivals(mixed: list[TraceRecord]) -> None:
    timed, backlog = run(mixed), run(mixed, backlog=True)
    span = mixed[-1].t_ms - mixed[0].t_ms
    assert timed.makespan_ms >= span  # the last item cannot finish before it arrives
    assert backlog.makespan_ms < timed.makespan_ms
    assert backlog.wait_percentile(0.5) > timed.wait_percentile(0.5)
    _r, lines = batch_lines(mixed, backlog=True)
    assert lines[0]["t_ms"] == 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("speed", [1.0, 2.5])
def test_each_item_waits_from_its_arrival_to_its_batch(
    mixed: list[TraceRecord], policy: str, speed: float
) -> None:
    """The waits are counted once the run ends (replay.waits): one per item, each the emitted
    batch's time minus the item's (speed-scaled) arrival."""
    report, lines = batch_lines(mixed, policy, speed=speed)
    arrival = {r.id: int(r.t_ms / speed) for r in mixed}
    expected = sorted(b["t_ms"] - arrival[item_id] for b in lines for item_id, _ in b["items"])
    assert len(expected) == len(mixed)
    assert sorted(report.waits_ms) == expected
    assert report.wait_percentile(1.0) == expected[-1] > 0


def test_speed_compresses_arrival_times(mixed: list[TraceRecord]) -> None:
    _r, normal = batch_lines(mixed)
    _r, fast = batch_lines(mixed, speed=4.0)
    assert max(b["t_ms"] for b in fast) < max(b["t_ms"] for b in normal) / 2
    assert run(mixed, speed=4.0).makespan_ms < run(mixed).makespan_ms / 2


def test_the_table_has_a_column_per_policy(mixed: list[TraceRecord]) -> None:
    table = render_table([run(mixed, p, backlog=True) for p in POLICIES])
    header, *rows = table.splitlines()
    assert header.split() == list(POLICIES)
    assert any(row.startswith("padding waste") for row in rows)
    assert len(rows) == 17


# ------------------------------------------------------------------------------ shipped traces


@pytest.fixture(scope="module")
def mooncake() -> list[TraceRecord]:
    return read_shipped("mooncake_synthetic", limit=2000)


def test_shipped_trace_lanes_keep_shapes_apart_and_balance(mooncake: list[TraceRecord]) -> None:
    assert len(mooncake) == 2000
    lanes, fifo = run(mooncake, "lanes"), run(mooncake, "fifo")
    assert lanes.mixed_shape_batches == 0 < fifo.mixed_shape_batches
    assert lanes.tokens_received == lanes.tokens_routed == lanes.tokens_completed
    assert lanes.padding_waste < fifo.padding_waste


@pytest.fixture(scope="module")
def azure_backlog() -> dict[str, SimReport]:
    records = read_shipped("azure_code")
    return {p: run(records, p, backlog=True) for p in ("lanes", "fifo", "sorted-window")}


def test_headline_lanes_waste_under_half_a_percent_on_azure_code(azure_backlog: dict[str, SimReport]) -> None:
    lanes = azure_backlog["lanes"]
    assert lanes.items == 8819
    assert lanes.mixed_shape_batches == 0
    assert lanes.padding_waste <= 0.005


@pytest.mark.parametrize("baseline", ["fifo", "sorted-window"])
def test_headline_lanes_waste_below_each_baseline_on_azure_code(
    azure_backlog: dict[str, SimReport], baseline: str
) -> None:
    assert azure_backlog["lanes"].padding_waste < azure_backlog[baseline].padding_waste


# ------------------------------------------------------------------------------ bad input


def test_parse_consumer_spec_reads_every_key() -> None:
    spec = parse_consumer_spec(
        "big:model=llama,budget=32768,items=128,pad=16,inflight=3,tps=50000,overhead_ms=2.5,cache=8,jitter=0.1"
    )
    c, card = spec.contract, spec.card
    assert (c.consumer, c.model, c.budget_tokens, c.max_items, c.pad_multiple, c.max_inflight) == (
        "big", "llama", 32768, 128, 16, 3
    )  # fmt: skip
    assert (card.tokens_per_s, card.overhead_ms, card.cache, card.jitter) == (50000.0, 2.5, 8, 0.1)


def test_parse_consumer_spec_defaults() -> None:
    c = parse_consumer_spec("solo:").contract
    assert (c.model, c.budget_tokens, c.max_items, c.pad_multiple, c.max_inflight) == (
        "default",
        16384,
        64,
        8,
        2,
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-colon", "expected NAME:key=value"),
        (":budget=1", "expected NAME:key=value"),
        ("c:budget", "'budget' is not key=value"),
        ("c:colour=red", "unknown key 'colour'"),
        ("c:budget=lots", "budget='lots' is not a number"),
        ("c:tps=fast", "tps='fast' is not a number"),
        ("c:budget=0", "budget_tokens must be a positive integer"),
        ("c:tps=0", "tps must be > 0"),
        ("c:jitter=1", "jitter must be in"),
        ("bad name:budget=1", "consumer id"),
    ],
)
def test_parse_consumer_spec_errors_name_the_spec(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match="--consumer") as info:
        parse_consumer_spec(spec)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("consumers", "kwargs", "message"),
    [
        ([], {}, "at least one consumer"),
        (CARDS, {"speed": 0}, "--speed must be > 0"),
        (CARDS[:1] * 2, {}, "given twice"),
        ([parse_consumer_spec("c:model=other")], {}, "no consumer serves model(s) default"),
        (CARDS, {"policy": "round-robin"}, "--policy 'round-robin'"),
    ],
)
def test_simulate_rejects_bad_setups(
    mixed: list[TraceRecord], consumers: list[ConsumerSpec], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        simulate(mixed[:10], consumers, **kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)


@pytest.mark.parametrize("width", [80, 120])
def test_the_table_folds_into_parts_that_fit_the_terminal(mixed: list[TraceRecord], width: int) -> None:
    wide = render_table([run(mixed, p, backlog=True) for p in POLICIES])
    table = render_table([run(mixed, p, backlog=True) for p in POLICIES], width)
    assert (
        max(len(line) for line in table.splitlines()) <= width < max(len(line) for line in wide.splitlines())
    )
    parts = table.split("\n\n")
    assert len(parts) > 1
    assert [p for part in parts for p in part.splitlines()[0].split()] == list(POLICIES)  # each policy once
    assert all(part.splitlines()[1].startswith("items ") for part in parts)  # the names repeat
