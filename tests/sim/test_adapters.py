"""Adapters in the simulator (processor/sim/simulator.py, baselines.py, adapters.py).

Lanes schedule by serving key, so no batch mixes adapters; the baselines model a multi-LoRA server
fed by a plain queue, so they do, and lose the prefix cache, which is per adapter. Consumers that
name one server share its card.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from processor.core.serving import serving_key
from processor.sim.adapters import main, with_adapters
from processor.sim.report import SimReport
from processor.sim.simulator import ConsumerSpec, parse_consumer_spec, simulate
from processor.sim.tracegen import synthetic_records, write_jsonl
from processor.sim.traces import TraceRecord, read_trace

ADAPTERS = {"tone": 0.3, "legal": 0.3}
CARD = "budget=4096,items=32,tps=50000,overhead_ms=5,cache=8"


def trace(n: int = 3000, seed: int = 5) -> list[TraceRecord]:
    records = synthetic_records(n, seed=seed, shapes=4, min_len=50, max_len=400, rate_per_s=400.0)
    return with_adapters(records, ADAPTERS, seed)


def specs(server: str = "gpu0") -> list[str]:
    """The base model and both adapters: three consumers, against one server unless ``server`` is ""."""
    on = f",server={server}" if server else ""
    return [f"card-{a or 'base'}:model=default,adapter={a}{on},{CARD}" for a in ("", *ADAPTERS)]


def consumers(server: str = "gpu0") -> list[ConsumerSpec]:
    return [parse_consumer_spec(s) for s in specs(server)]


def batches(records: list[TraceRecord], policy: str) -> tuple[list[dict[str, Any]], SimReport]:
    out = io.StringIO()
    report = simulate(records, consumers(), policy, emit=out)
    return [json.loads(line) for line in out.getvalue().splitlines()], report


def test_with_adapters_draws_each_share_and_leaves_the_rest_to_the_base_model() -> None:
    records = trace(20_000)
    counts = Counter(r.adapter for r in records)
    assert set(counts) == {"", "tone", "legal"}
    for name, share in {"": 0.4, **ADAPTERS}.items():
        assert counts[name] / len(records) == pytest.approx(share, abs=0.02)
    assert trace(500) == trace(500) != with_adapters(trace(500), ADAPTERS, 6)  # seeded
    assert [(r.model, r.shape, r.length) for r in trace(500)] == [
        (r.model, r.shape, r.length)
        for r in synthetic_records(500, seed=5, shapes=4, min_len=50, max_len=400, rate_per_s=400.0)
    ]


@pytest.mark.parametrize(
    ("shares", "message"),
    [
        ({"a": 0.7, "b": 0.4}, "sum to 1.1, past 1"),
        ({"a@b": 0.1}, "'a@b': a name without '@'"),
        ({"a": -0.1}, "not in"),
    ],
)
def test_with_adapters_refuses_shares_past_one_and_bad_names(shares: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        with_adapters(trace(10), shares, 0)


def test_lanes_never_mix_adapters_and_the_fifo_baseline_does_and_caches_worse() -> None:
    records = trace()
    key_of = {r.id: serving_key(r.model, r.adapter) for r in records}
    lanes_batches, lanes = batches(records, "lanes")
    fifo_batches, fifo = batches(records, "fifo")
    for b in lanes_batches:
        keys = {key_of[item_id] for item_id, _length in b["items"]}
        assert keys == {b["model"]}, f"lanes batch {b['batch_id']} mixes {sorted(keys)}"
        assert b["consumer"] == f"card-{b['model'].partition('@')[2] or 'base'}"
    assert lanes.mixed_adapter_batches == 0 < fifo.mixed_adapter_batches
    assert {b["model"] for b in fifo_batches} == {"default"}  # booked under the base model
    mixed = sum(len({key_of[i] for i, _n in b["items"]}) > 1 for b in fifo_batches)
    assert mixed == fifo.mixed_adapter_batches
    assert lanes.cache_hit_rate > fifo.cache_hit_rate
    for report in (lanes, fifo):
        assert report.tokens_completed == sum(r.length for r in records)
        assert report.adapters == 2


def test_the_oracle_never_mixes_adapters_either() -> None:
    oracle_batches, oracle = batches(trace(1000), "oracle")
    assert oracle.mixed_adapter_batches == 0 and oracle.mixed_shape_batches == 0
    assert oracle_batches


def test_consumers_of_one_server_share_its_engine_time() -> None:
    """One server runs its consumers' batches one after another: its makespan covers their busy time
    together; three servers of the same card run them side by side, in less."""
    records = trace(1500)
    shared = simulate(records, consumers(), "lanes", backlog=True)
    separate = simulate(records, consumers(server=""), "lanes", backlog=True)
    busy = sum(f.busy_ms for f in shared.consumers.values())
    assert shared.makespan_ms >= busy - 1e-6
    assert separate.makespan_ms < shared.makespan_ms


def test_a_consumer_spec_names_an_adapter_and_a_server() -> None:
    spec = parse_consumer_spec("card-tone:model=llama,adapter=tone,server=gpu0,budget=4096")
    assert (spec.contract.model, spec.server) == ("llama@tone", "gpu0")
    assert parse_consumer_spec("c:model=llama").contract.model == "llama"
    with pytest.raises(ValueError, match="adapter must not contain '@'"):
        parse_consumer_spec("c:model=llama,adapter=a@b")
    with pytest.raises(ValueError, match="model must not contain '@'"):
        parse_consumer_spec("c:model=llama@a")
    twice = [parse_consumer_spec("a:server=s,tps=1000"), parse_consumer_spec("b:server=s,tps=2000")]
    with pytest.raises(ValueError, match="server 's' is given two different cards"):
        simulate(trace(10), twice)


def test_an_adapter_no_consumer_serves_is_named() -> None:
    base_only = [parse_consumer_spec("card:model=default")]
    with pytest.raises(ValueError, match=r"no consumer serves model\(s\) default@legal, default@tone"):
        simulate(trace(100), base_only)


def test_the_native_trace_carries_adapters_and_the_module_writes_one(tmp_path: Path) -> None:
    records = trace(200)
    assert read_trace(write_jsonl(records, tmp_path / "t.jsonl"), "jsonl") == records
    source = write_jsonl(
        synthetic_records(300, seed=1, shapes=2, min_len=5, max_len=50, rate_per_s=None), tmp_path / "s.jsonl"
    )
    out = tmp_path / "a.jsonl.gz"
    assert main(["--trace", str(source), "--adapter", "tone=0.5", "--seed", "3", "--out", str(out)]) == 0
    written = read_trace(out, "jsonl")
    assert {r.adapter for r in written} == {"", "tone"} and len(written) == 300
    assert main(["--trace", str(source), "--adapter", "tone", "--out", str(out)]) == 2
