"""Batching modes in the simulator (processor/sim/simulator.py): memory batching never overflows a
card's memory where token batching does, and a consumer spec's own mode wins."""

from __future__ import annotations

import pytest

from processor.core.contract import BATCHING_MODES
from processor.sim.simulator import parse_consumer_spec, simulate
from processor.sim.traces import TraceRecord
from tests.core.helpers import SHAPE_A

# ------------------------------------------------------------------------------ memory, tokens, rows

CARDS = (
    "card16:budget=16384,items=64,tps=25000,memory_bytes=16384000,kv_bytes_per_token=1000",
    "card32:budget=32768,items=128,tps=50000,memory_bytes=32768000,kv_bytes_per_token=1000",
)


def trace() -> list[TraceRecord]:
    lengths = [40, 900, 1500, 3000, 120, 700, 2500, 60]
    return [
        TraceRecord(
            i * 5, "default", SHAPE_A + i % 2, lengths[i % 8] + i % 13, f"r{i}", (i * 37) % 1500, i + 1
        )
        for i in range(600)
    ]


@pytest.mark.parametrize("policy", ["lanes", "fifo", "sorted-window", "oracle"])
def test_memory_batching_never_overflows_where_token_batching_does(policy: str) -> None:
    records = trace()
    runs = {
        mode: simulate(
            records, [parse_consumer_spec(s, {"batching": mode}) for s in CARDS], policy, backlog=True
        )
        for mode in BATCHING_MODES
    }
    assert runs["memory"].over_memory == 0 and 0 < runs["memory"].kv_peak_fill <= 1
    assert runs["tokens"].over_memory > 0 and runs["tokens"].kv_peak_fill > 1
    assert runs["rows"].kv_peak_fill > runs["tokens"].kv_peak_fill
    assert runs["memory"].batches > runs["tokens"].batches > runs["rows"].batches
    for r in runs.values():
        assert r.tokens_routed == r.tokens_completed == sum(x.length for x in records)


def test_a_consumer_spec_key_beats_the_command_lines_mode() -> None:
    spec = parse_consumer_spec(
        "c:batching=rows", {"batching": "memory", "memory_bytes": 10, "kv_bytes_per_token": 1}
    )
    assert (spec.contract.batching, spec.contract.memory_bytes) == ("rows", 10)
